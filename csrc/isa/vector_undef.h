/* vector_undef.h -- forget one dtype's vector macros before an ISA file
 * defines the next dtype's (see kernels_impl.h for what they mean). */
#undef REAL
#undef VT
#undef VL
#undef VLOAD
#undef VSTORE
#undef VSTREAM
#undef VBCAST
#undef VZERO
#undef VADD
#undef VMUL
#undef VFMA
#undef VREDUCE
#undef KNAME
#undef KTABLE
#undef KEY_ROW_GATHER
#undef KEY_ROW_SCATTER
