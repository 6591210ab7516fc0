/*
 * module.c -- posenc._C, the CPython/NumPy binding.  Thin: parse, convert
 * (aligned, native, C-contiguous: the engine indexes raw memory), check
 * that the problem is consistent so the engine can never read out of
 * bounds, release the GIL, call, wrap.  The user-facing, per-method messages come from
 * posenc/_checks.py, which runs first; the checks here are the safety net
 * for direct calls of this private module.  One translation unit in parts:
 * module_config.h (EngineConfig -> problem), module_results.h (result
 * arrays), module_attention.h (the fused attention's calls).
 */
#define PY_SSIZE_T_CLEAN
#define _POSIX_C_SOURCE 200809L
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

#include "posenc.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

static int num_threads = 1;

#include "module_config.h"    /* EngineConfig -> posenc_problem, validated once */
#include "module_results.h"   /* result arrays, large ones in cached blocks */

/* 0 when a positional call got `want` arguments, else -1 with a TypeError. */
static int check_arity(Py_ssize_t nargs, Py_ssize_t want, const char *usage)
{
    if (nargs == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", usage, want, nargs);
    return -1;
}

static int raise_status(int status)
{
    if (status == POSENC_ENOMEM)
        PyErr_NoMemory();
    else if (status != POSENC_OK)
        PyErr_SetString(PyExc_ValueError, "posenc engine rejected the problem");
    return status == POSENC_OK ? 0 : -1;
}

/* The result of a call: a new one when `out` is None, else `out` itself,
 * which must be a writeable, aligned, C-contiguous array of q's dtype and of
 * `dims` (described by `layout`).  A new reference, or NULL with an exception. */
static PyArrayObject *result_or_out(PyObject *out, int ndim, const npy_intp *dims, int typenum,
                                    const char *layout)
{
    if (out == Py_None)
        return new_result(ndim, dims, typenum);
    if (!PyArray_Check(out) || PyArray_TYPE((PyArrayObject *)out) != typenum) {
        PyErr_SetString(PyExc_TypeError, "out must be a numpy.ndarray of q's dtype");
        return NULL;
    }
    PyArrayObject *o = (PyArrayObject *)out;
    if (PyArray_NDIM(o) != ndim || !PyArray_CompareLists(PyArray_DIMS(o), dims, ndim) ||
        !PyArray_IS_C_CONTIGUOUS(o) || !PyArray_ISWRITEABLE(o) || !PyArray_ISALIGNED(o) ||
        !PyArray_ISNOTSWAPPED(o)) {
        PyErr_Format(PyExc_ValueError, "out must be a writeable, aligned, C-contiguous %s array",
                     layout);
        return NULL;
    }
    Py_INCREF(out);
    return o;
}

/* forward(config, out): the logits (B, H, n, m) of one EngineConfig, written
 * into out when it is an array, else into a new one. */
static PyObject *py_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    converted a = {{NULL}};
    posenc_problem p;
    PyArrayObject *result = NULL;
    if (check_arity(nargs, 2, "forward(config, out)") || build_problem(args[0], &a, &p))
        goto fail;
    const npy_intp dims[4] = {(npy_intp)p.B, (npy_intp)p.H, (npy_intp)p.n, (npy_intp)p.m};
    const int typenum = typenum_of(p.dtype);
    if (!(result = result_or_out(args[1], 4, dims, typenum, "(B, H, n, m)")))
        goto fail;
    int status;
    const int threads = num_threads;
    Py_BEGIN_ALLOW_THREADS
    status = posenc_forward(&p, PyArray_DATA(result), threads);
    Py_END_ALLOW_THREADS
    if (raise_status(status))
        goto fail;
    release(&a);
    return (PyObject *)result;
fail:
    Py_XDECREF(result);
    release(&a);
    return NULL;
}

/*
 * The gradient outputs `needs` asks for (bit t: entry t of ENGINE_GRADS, for
 * an input the config has), each a new array shaped like its input, into
 * grads and g.  M4, M4M: when key_table_table is query_table_table and
 * key_table_map is query_table_map (one table read on both sides), one gradient,
 * in the query_table_table entry, that the engine sums both sides into (the two outputs
 * are the same buffer); either bit asks for it.  0, or -1 with an exception.
 */
static int new_grads(PyObject *config, const converted *a, unsigned int needs, int typenum,
                     PyArrayObject **grads, posenc_grads *g)
{
    const int shared_table =
        a->arr[CF_key_table_table] &&
        PyTuple_GET_ITEM(config, CF_key_table_table) == PyTuple_GET_ITEM(config, CF_query_table_table) &&
        PyTuple_GET_ITEM(config, CF_key_table_map) == PyTuple_GET_ITEM(config, CF_query_table_map);
    if (shared_table && (needs & (1u << GR_key_table_table))) {
        needs |= 1u << GR_query_table_table;
        needs &= ~(1u << GR_key_table_table);
    }
    void *data[GR_COUNT] = {NULL};
    memset(g, 0, sizeof *g);
    for (int t = 0; t < GR_COUNT; ++t) {
        PyArrayObject *src = a->arr[grad_source[t]];
        if (!src || !(needs & (1u << t)))
            continue;
        /* of its input's dtype (the problem's); a term module's per unit, float64
         * (B, H, per_unit) (csrc/terms.h) */
        const int module = t >= GR_FIRST_TERM_;
        const npy_intp per_unit[3] = {PyArray_DIM(a->arr[CF_q], 0), PyArray_DIM(a->arr[CF_q], 1),
                                      PyArray_DIM(src, PyArray_NDIM(src) - 1)};
        if (!(grads[t] = new_result(module ? 3 : PyArray_NDIM(src),
                                    module ? per_unit : PyArray_DIMS(src),
                                    module ? NPY_DOUBLE : PyArray_TYPE(src))))
            return -1;
        data[t] = PyArray_DATA(grads[t]);
    }
    g->q = data[GR_q];
    g->k = data[GR_k];
    int place[POSENC_TERM_COUNT] = {0}, entry = GR_FIRST_TERM_;
    for (int t = 0; t < TERM_FIELD_COUNT; ++t) {
        const int k = term_fields[t].kind, at = place[k]++;
        if (term_fields[t].grad)
            g->terms[k][at] = data[entry++];
    }
    if (shared_table)   /* the table, each kind's first array */
        g->terms[POSENC_TERM_key_table][0] = data[GR_query_table_table];
    return 0;
}

/* A tuple of grads[0 .. count), None where NULL, that takes the arrays over
 * (their entries become NULL); NULL with an exception. */
static PyObject *grads_tuple(PyArrayObject **grads, int count)
{
    PyObject *result = PyTuple_New(count);
    if (!result)
        return NULL;
    for (int t = 0; t < count; ++t) {
        PyObject *item = grads[t] ? (PyObject *)grads[t] : Py_None;
        if (!grads[t])
            Py_INCREF(Py_None);
        grads[t] = NULL;
        PyTuple_SET_ITEM(result, t, item);
    }
    return result;
}

/*
 * backward(G, config, needs): the gradients of sum(G * forward(config)) as
 * a tuple in ENGINE_GRADS order, None where absent or not in `needs`.
 * When key_table_table is query_table_table and key_table_map is query_table_map
 * (one table on both sides), both sides' gradients are summed into the
 * query_table_table entry and the key_table_table entry is None; either bit asks for it.
 */
static PyObject *py_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    converted a = {{NULL}};
    posenc_problem p;
    PyArrayObject *G = NULL;
    PyArrayObject *grads[GR_COUNT] = {NULL};
    PyObject *result = NULL;
    if (check_arity(nargs, 3, "backward(G, config, needs)"))
        return NULL;
    const unsigned long needs_value = PyLong_AsUnsignedLongMask(args[2]);
    if (needs_value == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    unsigned int needs = (unsigned int)(needs_value & ((1u << GR_COUNT) - 1));
    if (build_problem(args[1], &a, &p))
        goto fail;
    const int typenum = typenum_of(p.dtype);
    if (args[0] == Py_None || !(G = as_float_array(args[0], typenum, "G")))
        goto fail_g;
    if (check_dims(G, "G", 4, (npy_intp[]){(npy_intp)p.B, (npy_intp)p.H, (npy_intp)p.n, (npy_intp)p.m}))
        goto fail;
    posenc_grads g;
    if (new_grads(args[1], &a, needs, typenum, grads, &g))
        goto fail;
    int status;
    const int threads = num_threads;
    const void *grad_logits = PyArray_DATA(G);
    Py_BEGIN_ALLOW_THREADS
    status = posenc_backward(&p, grad_logits, &g, threads);
    Py_END_ALLOW_THREADS
    if (raise_status(status))
        goto fail;
    if (!(result = grads_tuple(grads, GR_COUNT)))
        goto fail;
    Py_DECREF(G);
    release(&a);
    return result;
fail_g:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "G must be a numpy.ndarray");
fail:
    for (int t = 0; t < GR_COUNT; ++t)
        Py_XDECREF(grads[t]);
    Py_XDECREF(G);
    release(&a);
    return NULL;
}

#include "module_attention.h"   /* attention_forward, attention_backward */

/* ------------------------------------------------------------ dense products */

/* A 2-D operand of matmul of `typenum` that the engine reads in place
 * (aligned, native, strides >= 0 and multiples of the item size; with
 * `unit` a unit stride on one axis): obj itself, or a C-contiguous copy.
 * A new reference, or NULL with an exception. */
static PyArrayObject *as_matrix(PyObject *obj, int typenum, const char *name, int unit)
{
    if (check_float_array(obj, typenum, name, "a"))
        return NULL;
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (PyArray_NDIM(arr) != 2) {
        PyErr_Format(PyExc_ValueError, "%s must be 2-D, got %d dimensions", name, PyArray_NDIM(arr));
        return NULL;
    }
    const npy_intp size = (npy_intp)typenum_itemsize(typenum), *st = PyArray_STRIDES(arr);
    int in_place = PyArray_ISALIGNED(arr) && PyArray_ISNOTSWAPPED(arr);
    for (int t = 0; t < 2; ++t)
        in_place = in_place && st[t] >= 0 && st[t] % size == 0;
    if (unit)   /* an axis of one element (or none) takes any stride: stride_of's 1 */
        in_place = in_place && (st[0] == size || st[1] == size || PyArray_DIM(arr, 0) <= 1 ||
                                PyArray_DIM(arr, 1) <= 1);
    if (in_place) {
        Py_INCREF(obj);
        return arr;
    }
    return (PyArrayObject *)PyArray_FROM_OTF(obj, typenum, NPY_ARRAY_IN_ARRAY);
}

/* The stride of axis `axis` of a 2-D operand in elements: 1 where the axis has at most one. */
static ptrdiff_t stride_of(PyArrayObject *arr, int axis)
{
    if (PyArray_DIM(arr, axis) <= 1)
        return 1;
    return (ptrdiff_t)(PyArray_STRIDE(arr, axis) / (npy_intp)PyArray_ITEMSIZE(arr));
}

/* matmul(a, b, bias): a (M, K) @ b (K, N) [+ bias (N,)], a new (M, N) array. */
static PyObject *py_matmul(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyArrayObject *a = NULL, *b = NULL, *bias = NULL, *result = NULL;
    if (check_arity(nargs, 3, "matmul(a, b, bias)"))
        goto fail;
    if (!PyArray_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "a must be a numpy.ndarray");
        goto fail;
    }
    const int typenum = PyArray_TYPE((PyArrayObject *)args[0]);
    const int dtype = dtype_of(typenum);
    if (dtype != POSENC_F32 && dtype != POSENC_F64) {
        PyErr_Format(PyExc_TypeError, "matmul takes float32 or float64, got %R",
                     (PyObject *)PyArray_DESCR((PyArrayObject *)args[0]));
        goto fail;
    }
    if (!(a = as_matrix(args[0], typenum, "a", 0)) || !(b = as_matrix(args[1], typenum, "b", 1)))
        goto fail;
    const npy_intp M = PyArray_DIM(a, 0), K = PyArray_DIM(a, 1), N = PyArray_DIM(b, 1);
    if (PyArray_DIM(b, 0) != K) {
        PyErr_Format(PyExc_ValueError, "matmul: a is (%zd, %zd) but b is (%zd, %zd)", (Py_ssize_t)M,
                     (Py_ssize_t)K, (Py_ssize_t)PyArray_DIM(b, 0), (Py_ssize_t)N);
        goto fail;
    }
    if (args[2] != Py_None) {
        if (check_float_array(args[2], typenum, "bias", "a") ||
            !(bias = (PyArrayObject *)PyArray_FROM_OTF(args[2], typenum, NPY_ARRAY_IN_ARRAY)))
            goto fail;
        if (PyArray_NDIM(bias) != 1 || PyArray_DIM(bias, 0) != N) {
            PyErr_Format(PyExc_ValueError, "matmul: bias must be (%zd,)", (Py_ssize_t)N);
            goto fail;
        }
    }
    const npy_intp dims[2] = {M, N};
    if (!(result = new_result(2, dims, typenum)))
        goto fail;
    const posenc_matmul_problem mm = {
        (posenc_dtype)dtype, (size_t)M, (size_t)N, (size_t)K,
        PyArray_DATA(a), stride_of(a, 0), stride_of(a, 1),
        PyArray_DATA(b), stride_of(b, 0), stride_of(b, 1),
        bias ? PyArray_DATA(bias) : NULL, PyArray_DATA(result), N};
    int status;
    const int threads = num_threads;
    Py_BEGIN_ALLOW_THREADS
    status = posenc_matmul(&mm, threads);
    Py_END_ALLOW_THREADS
    if (raise_status(status))
        goto fail;
    Py_DECREF(a);
    Py_DECREF(b);
    Py_XDECREF(bias);
    return (PyObject *)result;
fail:
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(bias);
    Py_XDECREF(result);
    return NULL;
}

/* posenc._C.narrow_bf16: its argument (float64, any layout) as a new C-contiguous bfloat16
 * array, rounded once to nearest even (posenc_narrow_bf16). */
static PyObject *py_narrow_bf16(PyObject *self, PyObject *values)
{
    PyArrayObject *src = NULL, *result = NULL;
    if (bfloat16_typenum < 0) {
        PyErr_SetString(PyExc_RuntimeError, "narrow_bf16: bfloat16 needs ml_dtypes");
        goto fail;
    }
    if (!(src = (PyArrayObject *)PyArray_FROM_OTF(values, NPY_DOUBLE, NPY_ARRAY_IN_ARRAY)) ||
        !(result = new_result(PyArray_NDIM(src), PyArray_DIMS(src), bfloat16_typenum)))
        goto fail;
    const double *from = (const double *)PyArray_DATA(src);
    uint16_t *to = (uint16_t *)PyArray_DATA(result);
    const size_t count = (size_t)PyArray_SIZE(src);
    Py_BEGIN_ALLOW_THREADS
    posenc_narrow_bf16(to, from, count);
    Py_END_ALLOW_THREADS
    Py_DECREF(src);
    return (PyObject *)result;
fail:
    Py_XDECREF(src);
    Py_XDECREF(result);
    return NULL;
}

/* ------------------------------------------------------------ ISA, threads */

/* The names of the ISAs for which `keep` says yes, as a list. */
static PyObject *isa_list(int (*keep)(posenc_isa))
{
    PyObject *list = PyList_New(0);
    if (!list)
        return NULL;
    for (int isa = 0; isa < POSENC_ISA_COUNT; ++isa) {
        if (!keep((posenc_isa)isa))
            continue;
        PyObject *name = PyUnicode_FromString(posenc_isa_name((posenc_isa)isa));
        if (!name || PyList_Append(list, name)) {
            Py_XDECREF(name);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(name);
    }
    return list;
}

/* Whether bfloat16 content logits run on vdpbf16ps now (docs/low_precision.md
 * design (b): the active ISA avx512 on a CPU and build with AVX512-BF16). */
static PyObject *py_bf16_dot(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(posenc_active_bf16_kernels() != NULL);
}

static PyObject *py_capabilities(PyObject *self, PyObject *unused)
{
    return isa_list(posenc_isa_supported);
}

static PyObject *py_compiled_isas(PyObject *self, PyObject *unused)
{
    return isa_list(posenc_isa_compiled);
}

static PyObject *py_get_isa(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(posenc_isa_name(posenc_get_isa()));
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg)
{
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "isa must be a str, got %s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name)
        return NULL;
    const int isa = posenc_isa_from_name(name);
    if (isa < 0 || posenc_set_isa((posenc_isa)isa) != 0) {
        PyObject *valid = py_capabilities(NULL, NULL);
        if (!valid)
            return NULL;
        PyErr_Format(PyExc_ValueError, "%s ISA %R; this CPU supports %R",
                     isa < 0 ? "unknown" : "unsupported", arg, valid);
        Py_DECREF(valid);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_set_num_threads(PyObject *self, PyObject *arg)
{
    const long value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred())
        return NULL;
    if (value < 1 || value > POSENC_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be in [1, %d], got %ld", POSENC_MAX_THREADS,
                     value);
        return NULL;
    }
    num_threads = (int)value;
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *unused)
{
    return PyLong_FromLong(num_threads);
}

static PyObject *py_build_info(PyObject *self, PyObject *unused)
{
#ifdef _OPENMP
    const long openmp = _OPENMP;
#else
    const long openmp = 0;
#endif
#if defined(__clang__)
    const char *compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
    const char *compiler = "gcc " __VERSION__;
#else
    const char *compiler = "unknown";
#endif
    return Py_BuildValue("{s:s,s:l,s:i,s:N}", "compiler", compiler, "openmp", openmp,
                         "max_threads", posenc_max_threads(), "compiled_isas",
                         py_compiled_isas(NULL, NULL));
}

static PyMethodDef methods[] = {
    {"forward", (PyCFunction)(void (*)(void))py_forward, METH_FASTCALL,
     "forward(config, out)\n\nThe logits (B, H, n, m) of one EngineConfig (posenc/_engine.py),\n"
     "into out when it is an array.  Private: use the posenc package."},
    {"backward", (PyCFunction)(void (*)(void))py_backward, METH_FASTCALL,
     "backward(G, config, needs)\n\nGradients of sum(G * forward(config)) in ENGINE_GRADS order;\n"
     "None where absent or not in the bit mask `needs`; one table on both sides\n"
     "(key_table_table is query_table_table, key_table_map is query_table_map) gives one\n"
     "gradient, in the query_table_table entry.\n"
     "Private: use the posenc package."},
    {"attention_forward", (PyCFunction)(void (*)(void))py_attention_forward, METH_FASTCALL,
     "attention_forward(config, v, key_padding_mask, causal, dropout_p, seed, out)\n\n"
     "The fused attention (SPEC 6) of one EngineConfig: (out (B, H, n, dv), lse (B, H, n)).\n"
     "Private: use the posenc package."},
    {"attention_backward", (PyCFunction)(void (*)(void))py_attention_backward, METH_FASTCALL,
     "attention_backward(d_out, config, v, out, lse, key_padding_mask, causal, dropout_p, seed,\n"
     "window, document_q, document_k, softcap, sinks, needs, d_lse)\n\nThe gradients of\n"
     "backward, then dv and dsinks (bits of needs); d_lse: dL/dlse or None.  Private: use the\n"
     "posenc package."},
    {"matmul", (PyCFunction)(void (*)(void))py_matmul, METH_FASTCALL,
     "matmul(a, b, bias)\n\na (M, K) @ b (K, N) [+ bias (N,)], float32 or float64, as a new array\n"
     "(strided a and b are read in place).  Private: posenc.torch._linear uses it."},
    {"narrow_bf16", py_narrow_bf16, METH_O,
     "narrow_bf16(values): float64 values as a new bfloat16 array, rounded once to nearest even."},
    {"capabilities", py_capabilities, METH_NOARGS, "ISAs this CPU and OS support, compiled in."},
    {"bf16_dot", py_bf16_dot, METH_NOARGS,
     "Whether bfloat16 content logits run on vdpbf16ps (AVX512-BF16) under the active ISA."},
    {"compiled_isas", py_compiled_isas, METH_NOARGS, "ISAs compiled into this build."},
    {"get_isa", py_get_isa, METH_NOARGS, "The ISA whose kernels run."},
    {"set_isa", py_set_isa, METH_O, "Select the ISA by name (ValueError if unsupported)."},
    {"set_num_threads", py_set_num_threads, METH_O, "Threads of every kernel call."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "Threads of every kernel call."},
    {"build_info", py_build_info, METH_NOARGS, "Compiler, OpenMP and compiled ISAs."},
    {"_set_bfloat16", py_set_bfloat16, METH_O,
     "_set_bfloat16(num): the NumPy type number of ml_dtypes.bfloat16 (posenc sets it at\n"
     "import when ml_dtypes is installed)."},
    {"set_result_cache", py_set_result_cache, METH_O,
     "Bytes of freed large results kept for reuse (0: none)."},
    {"result_cache_info", py_result_cache_info, METH_NOARGS,
     "The result cache: its budget, and the blocks and bytes it holds now."},
    {NULL, NULL, 0, NULL}};

/* module.name = a tuple of the count strings of names; 0, or -1 with an exception. */
static int add_names(PyObject *module, const char *name, const char *const *names, int count)
{
    PyObject *tuple = PyTuple_New(count);
    if (!tuple)
        return -1;
    for (int t = 0; t < count; ++t) {
        PyObject *item = PyUnicode_FromString(names[t]);
        if (!item) {
            Py_DECREF(tuple);
            return -1;
        }
        PyTuple_SET_ITEM(tuple, t, item);
    }
    const int rc = PyModule_AddObject(module, name, tuple);
    if (rc)
        Py_DECREF(tuple);
    return rc;
}

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "posenc._C",
                                    "posenc's C engine (private: use the posenc package).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__C(void)
{
    import_array();
    if (PyType_Ready(&ResultBlock_Type) < 0 || result_cache_from_env() < 0)
        return NULL;
    posenc_dispatch_init();
    num_threads = posenc_max_threads();   /* OMP_NUM_THREADS, or every core */
    PyObject *m = PyModule_Create(&module);
    /* the names posenc._engine builds EngineConfig and ENGINE_GRADS from */
    if (m && (add_names(m, "CONFIG_FIELDS", config_names, CF_COUNT) ||
              add_names(m, "ENGINE_GRADS", grad_names, GR_COUNT))) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
