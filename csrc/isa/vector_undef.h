/* vector_undef.h -- forget one dtype's vector macros before a vector layer
 * (vectors_<isa>.h) defines the next dtype's (see kernels_impl.h). */
#undef REAL
#undef VT
#undef VL
#undef VLOAD
#undef VSTORE
#undef VSTREAM
#undef VLOAD_PART
#undef VSTORE_PART
#undef VLOAD_RANGE
#undef VBCAST
#undef VZERO
#undef VADD
#undef VMUL
#undef VFMA
#undef VREDUCE
#undef VREDUCE4
#undef VTRANSPOSE
#undef KNAME
