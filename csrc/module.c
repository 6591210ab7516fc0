/*
 * module.c -- posenc._C, the CPython/NumPy binding.  Thin: parse, convert
 * (aligned, native, C-contiguous: STYLE.md 6), check that the problem is
 * consistent so the engine can never read out of bounds, release the GIL,
 * call, wrap.  The user-facing, per-method messages come from
 * posenc/_checks.py, which runs first; the checks here are the safety net
 * for direct calls of this private module.
 */
#define PY_SSIZE_T_CLEAN
#define _POSIX_C_SOURCE 200809L
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_2_0_API_VERSION
#include <numpy/arrayobject.h>

#include "posenc.h"

#include <stdint.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

static int num_threads = 1;

/* Every array a call converts, released on the one exit path. */
enum {
    A_Q, A_K, A_G, A_OUT, A_POS_Q, A_POS_K, A_TABLE, A_TABLE_MAP, A_VQ, A_VQ_MAP, A_VK, A_VK_MAP,
    A_SEG_Q, A_SEG_K, A_SEG_TABLE, A_THETA, A_COUNT
};

static const char *const arg_names[A_COUNT] = {
    "q", "k", "G", "out", "pos_q", "pos_k", "table", "table_map", "vq_table", "vq_map",
    "vk_table", "vk_map", "seg_q", "seg_k", "seg_table", "theta"};

/* Gradient outputs, in the order backward returns them. */
enum { GR_Q, GR_K, GR_POS_Q, GR_POS_K, GR_TABLE, GR_VQ, GR_VK, GR_SEG, GR_THETA, GR_COUNT };

typedef struct {
    PyObject *obj[A_COUNT];
    PyArrayObject *arr[A_COUNT];
    int combine;
    double scale, dense_scale, vec_scale;
} call_args;

static void release(call_args *a)
{
    for (int t = 0; t < A_COUNT; ++t)
        Py_XDECREF(a->arr[t]);
}

static int as_float_array(call_args *a, int slot, int typenum)
{
    PyObject *obj = a->obj[slot];
    if (obj == NULL || obj == Py_None)
        return 0;
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, got %s", arg_names[slot],
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyArray_TYPE((PyArrayObject *)obj) != typenum) {
        PyErr_Format(PyExc_TypeError, "%s must have dtype %s like q", arg_names[slot],
                     typenum == NPY_FLOAT ? "float32" : "float64");
        return -1;
    }
    a->arr[slot] = (PyArrayObject *)PyArray_FROM_OTF(obj, typenum, NPY_ARRAY_IN_ARRAY);
    return a->arr[slot] ? 0 : -1;
}

static int as_index_array(call_args *a, int slot)
{
    PyObject *obj = a->obj[slot];
    if (obj == NULL || obj == Py_None)
        return 0;
    if (!PyArray_Check(obj) || !PyArray_ISINTEGER((PyArrayObject *)obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an integer numpy.ndarray", arg_names[slot]);
        return -1;
    }
    a->arr[slot] = (PyArrayObject *)PyArray_FROM_OTF(obj, NPY_INT64, NPY_ARRAY_IN_ARRAY);
    return a->arr[slot] ? 0 : -1;
}

static int check_dims(call_args *a, int slot, int ndim, const npy_intp *want)
{
    PyArrayObject *arr = a->arr[slot];
    if (!arr)
        return 0;
    if (PyArray_NDIM(arr) != ndim)
        goto bad;
    for (int t = 0; t < ndim; ++t)
        if (want[t] >= 0 && PyArray_DIM(arr, t) != want[t])
            goto bad;
    return 0;
bad:
    PyErr_Format(PyExc_ValueError, "%s has an inconsistent shape (%d dimensions)", arg_names[slot],
                 PyArray_NDIM(arr));
    return -1;
}

#define DATA(slot) (a->arr[slot] ? PyArray_DATA(a->arr[slot]) : NULL)
#define DIM(slot, t) ((size_t)PyArray_DIM(a->arr[slot], (t)))

/* Convert every argument and fill the problem; 0 or -1 with an exception. */
static int build_problem(call_args *a, posenc_problem *p)
{
    memset(p, 0, sizeof *p);
    if (!a->obj[A_Q] || !PyArray_Check(a->obj[A_Q])) {
        PyErr_SetString(PyExc_TypeError, "q must be a numpy.ndarray");
        return -1;
    }
    const int typenum = PyArray_TYPE((PyArrayObject *)a->obj[A_Q]);
    if (typenum != NPY_FLOAT && typenum != NPY_DOUBLE) {
        PyErr_SetString(PyExc_TypeError, "q must have dtype float32 or float64");
        return -1;
    }
    static const int float_slots[] = {A_Q, A_K, A_G, A_POS_Q, A_POS_K, A_TABLE, A_VQ, A_VK, A_SEG_TABLE, A_THETA};
    for (size_t t = 0; t < sizeof float_slots / sizeof float_slots[0]; ++t)
        if (as_float_array(a, float_slots[t], typenum))
            return -1;
    static const int index_slots[] = {A_TABLE_MAP, A_VQ_MAP, A_VK_MAP, A_SEG_Q, A_SEG_K};
    for (size_t t = 0; t < sizeof index_slots / sizeof index_slots[0]; ++t)
        if (as_index_array(a, index_slots[t]))
            return -1;
    if (!a->arr[A_K]) {
        PyErr_SetString(PyExc_TypeError, "k is required");
        return -1;
    }

    const npy_intp any = -1;
    if (check_dims(a, A_Q, 4, (npy_intp[]){any, any, any, any}))
        return -1;
    const npy_intp B = PyArray_DIM(a->arr[A_Q], 0), H = PyArray_DIM(a->arr[A_Q], 1);
    const npy_intp n = PyArray_DIM(a->arr[A_Q], 2), d = PyArray_DIM(a->arr[A_Q], 3);
    if (check_dims(a, A_K, 4, (npy_intp[]){B, H, any, d}))
        return -1;
    const npy_intp m = PyArray_DIM(a->arr[A_K], 2);
    const npy_intp offsets = (n > 0 && m > 0) ? n + m - 1 : 0;
    const npy_intp logits[4] = {B, H, n, m};
    if (check_dims(a, A_G, 4, logits))
        return -1;
    if (a->obj[A_POS_Q] != NULL && a->obj[A_POS_Q] != Py_None) {
        if (!a->arr[A_POS_K]) {
            PyErr_SetString(PyExc_ValueError, "pos_q and pos_k come together");
            return -1;
        }
        if (check_dims(a, A_POS_Q, 3, (npy_intp[]){any, n, any}))
            return -1;
        const npy_intp dp = PyArray_DIM(a->arr[A_POS_Q], 2);
        if (check_dims(a, A_POS_K, 3, (npy_intp[]){any, m, dp}))
            return -1;
        p->pos_q = DATA(A_POS_Q);
        p->pos_k = DATA(A_POS_K);
        p->pos_q_heads = DIM(A_POS_Q, 0);
        p->pos_k_heads = DIM(A_POS_K, 0);
        p->d_p = (size_t)dp;
    }
    /* tables with their maps */
    const struct { int table, map, ndim; } tables[3] = {
        {A_TABLE, A_TABLE_MAP, 2}, {A_VQ, A_VQ_MAP, 3}, {A_VK, A_VK_MAP, 3}};
    for (int t = 0; t < 3; ++t) {
        if (!a->arr[tables[t].table])
            continue;
        const npy_intp want[3] = {any, any, d};
        if (check_dims(a, tables[t].table, tables[t].ndim, want) ||
            !a->arr[tables[t].map] || check_dims(a, tables[t].map, 1, (npy_intp[]){offsets})) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "%s needs %s", arg_names[tables[t].table],
                             arg_names[tables[t].map]);
            return -1;
        }
    }
    p->table = DATA(A_TABLE);
    if (p->table) {
        p->table_heads = DIM(A_TABLE, 0);
        p->table_rows = DIM(A_TABLE, 1);
        p->table_map = (const int64_t *)DATA(A_TABLE_MAP);
    }
    p->vq_table = DATA(A_VQ);
    if (p->vq_table) {
        p->vq_heads = DIM(A_VQ, 0);
        p->vq_rows = DIM(A_VQ, 1);
        p->vq_map = (const int64_t *)DATA(A_VQ_MAP);
    }
    p->vk_table = DATA(A_VK);
    if (p->vk_table) {
        p->vk_heads = DIM(A_VK, 0);
        p->vk_rows = DIM(A_VK, 1);
        p->vk_map = (const int64_t *)DATA(A_VK_MAP);
    }
    if (a->arr[A_SEG_TABLE] || a->arr[A_SEG_Q] || a->arr[A_SEG_K]) {
        if (!a->arr[A_SEG_TABLE] || !a->arr[A_SEG_Q] || !a->arr[A_SEG_K]) {
            PyErr_SetString(PyExc_ValueError, "seg_q, seg_k and seg_table come together");
            return -1;
        }
        if (check_dims(a, A_SEG_TABLE, 3, (npy_intp[]){any, any, any}))
            return -1;
        const npy_intp S = PyArray_DIM(a->arr[A_SEG_TABLE], 1);
        if (check_dims(a, A_SEG_TABLE, 3, (npy_intp[]){any, S, S}) ||
            check_dims(a, A_SEG_Q, 2, (npy_intp[]){B, n}) ||
            check_dims(a, A_SEG_K, 2, (npy_intp[]){B, m}))
            return -1;
        p->seg_table = DATA(A_SEG_TABLE);
        p->seg_q = (const int64_t *)DATA(A_SEG_Q);
        p->seg_k = (const int64_t *)DATA(A_SEG_K);
        p->seg_heads = DIM(A_SEG_TABLE, 0);
        p->n_segments = (size_t)S;
    }
    if (a->arr[A_THETA]) {
        if (check_dims(a, A_THETA, 2, (npy_intp[]){any, 2}))
            return -1;
        p->theta = DATA(A_THETA);
        p->theta_heads = DIM(A_THETA, 0);
    }
    p->dtype = typenum == NPY_FLOAT ? POSENC_F32 : POSENC_F64;
    p->combine = a->combine ? POSENC_PRODUCT : POSENC_SUM;
    p->B = (size_t)B;
    p->H = (size_t)H;
    p->n = (size_t)n;
    p->m = (size_t)m;
    p->d = (size_t)d;
    p->scale = a->scale;
    p->dense_scale = a->dense_scale;
    p->vec_scale = a->vec_scale;
    p->q = DATA(A_Q);
    p->k = DATA(A_K);
    const char *why = NULL;
    if (posenc_validate(p, &why) != POSENC_OK) {
        PyErr_Format(PyExc_ValueError, "inconsistent problem: %s", why);
        return -1;
    }
    return 0;
}

/*
 * Results are 64-byte aligned so the engine can stream them to memory.
 * NumPy's own allocation (which asks the kernel for huge pages: far fewer
 * page faults on a fresh 100 MB result) aligns to 16 bytes, so the result
 * is an aligned view into a slightly larger NumPy buffer, which it owns
 * through its base.
 */
static PyArrayObject *new_aligned_array(int ndim, const npy_intp *dims, int typenum)
{
    const npy_intp itemsize = typenum == NPY_FLOAT ? (npy_intp)sizeof(float) : (npy_intp)sizeof(double);
    npy_intp count = 1;
    for (int t = 0; t < ndim; ++t)
        count *= dims[t];
    const npy_intp bytes = count * itemsize + 64;
    PyArrayObject *buffer = (PyArrayObject *)PyArray_SimpleNew(1, (npy_intp[]){bytes}, NPY_UINT8);
    if (!buffer)
        return NULL;
    char *data = (char *)PyArray_DATA(buffer);
    data += (64 - (uintptr_t)data % 64) % 64;
    PyArrayObject *array = (PyArrayObject *)PyArray_New(&PyArray_Type, ndim, (npy_intp *)dims, typenum,
                                                        NULL, data, 0, NPY_ARRAY_CARRAY, NULL);
    if (!array || PyArray_SetBaseObject(array, (PyObject *)buffer) < 0) {   /* steals buffer */
        Py_XDECREF(array);
        if (!array)
            Py_DECREF(buffer);
        return NULL;
    }
    return array;
}

static int raise_status(int status)
{
    if (status == POSENC_ENOMEM)
        PyErr_NoMemory();
    else if (status != POSENC_OK)
        PyErr_SetString(PyExc_ValueError, "posenc engine rejected the problem");
    return status == POSENC_OK ? 0 : -1;
}

#define PROBLEM_KWLIST                                                                       \
    "combine", "scale", "pos_q", "pos_k", "dense_scale", "table", "table_map", "vq_table",   \
        "vq_map", "vk_table", "vk_map", "vec_scale", "seg_q", "seg_k", "seg_table", "theta"
#define PROBLEM_FORMAT "pdOOdOOOOOOdOOOO"
#define PROBLEM_TARGETS(a)                                                                   \
    &(a).combine, &(a).scale, &(a).obj[A_POS_Q], &(a).obj[A_POS_K], &(a).dense_scale,          \
        &(a).obj[A_TABLE], &(a).obj[A_TABLE_MAP], &(a).obj[A_VQ], &(a).obj[A_VQ_MAP],          \
        &(a).obj[A_VK], &(a).obj[A_VK_MAP], &(a).vec_scale, &(a).obj[A_SEG_Q],                 \
        &(a).obj[A_SEG_K], &(a).obj[A_SEG_TABLE], &(a).obj[A_THETA]

static void init_args(call_args *a)
{
    memset(a, 0, sizeof *a);
    a->scale = 1.0;
    a->dense_scale = 1.0;
    a->vec_scale = 1.0;
}

PyDoc_STRVAR(forward_doc,
"forward(q, k, *, combine=False, scale=1.0, pos_q=None, pos_k=None, dense_scale=1.0,\n"
"        table=None, table_map=None, vq_table=None, vq_map=None, vk_table=None,\n"
"        vk_map=None, vec_scale=1.0, seg_q=None, seg_k=None, seg_table=None,\n"
"        theta=None, out=None)\n\n"
"The engine's logits for one configured problem (see csrc/posenc.h).\n"
"Private: use the functions of the posenc package.");

static PyObject *py_forward(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"q", "k", PROBLEM_KWLIST, "out", NULL};
    call_args a;
    posenc_problem p;
    PyArrayObject *result = NULL;
    (void)self;
    init_args(&a);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$" PROBLEM_FORMAT "O", kwlist,
                                     &a.obj[A_Q], &a.obj[A_K], PROBLEM_TARGETS(a), &a.obj[A_OUT]))
        return NULL;
    if (build_problem(&a, &p))
        goto fail;
    const npy_intp dims[4] = {(npy_intp)p.B, (npy_intp)p.H, (npy_intp)p.n, (npy_intp)p.m};
    const int typenum = p.dtype == POSENC_F32 ? NPY_FLOAT : NPY_DOUBLE;
    if (a.obj[A_OUT] && a.obj[A_OUT] != Py_None) {
        PyObject *out = a.obj[A_OUT];
        if (!PyArray_Check(out) || PyArray_TYPE((PyArrayObject *)out) != typenum) {
            PyErr_SetString(PyExc_TypeError, "out must be a numpy.ndarray of q's dtype");
            goto fail;
        }
        PyArrayObject *o = (PyArrayObject *)out;
        if (PyArray_NDIM(o) != 4 || !PyArray_CompareLists(PyArray_DIMS(o), dims, 4) ||
            !PyArray_IS_C_CONTIGUOUS(o) || !PyArray_ISWRITEABLE(o) || !PyArray_ISALIGNED(o) ||
            !PyArray_ISNOTSWAPPED(o)) {
            PyErr_SetString(PyExc_ValueError,
                            "out must be a writeable, aligned, C-contiguous (B, H, n, m) array");
            goto fail;
        }
        Py_INCREF(out);
        result = o;
    } else {
        result = new_aligned_array(4, dims, typenum);
        if (!result)
            goto fail;
    }
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

PyDoc_STRVAR(backward_doc,
"backward(G, q, k, *, <forward's keywords>, needs=0x1ff)\n\n"
"Gradients of sum(G * forward(...)) as a 9-tuple (q, k, pos_q, pos_k, table,\n"
"vq_table, vk_table, seg_table, theta); None where absent or not in `needs`\n"
"(bit t of needs asks for entry t).  Private: use the posenc package.");

static PyObject *py_backward(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"G", "q", "k", PROBLEM_KWLIST, "needs", NULL};
    call_args a;
    posenc_problem p;
    unsigned int needs = (1u << GR_COUNT) - 1;
    PyArrayObject *grads[GR_COUNT] = {NULL};
    PyObject *result = NULL;
    (void)self;
    init_args(&a);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|$" PROBLEM_FORMAT "I", kwlist,
                                     &a.obj[A_G], &a.obj[A_Q], &a.obj[A_K], PROBLEM_TARGETS(a),
                                     &needs))
        return NULL;
    if (build_problem(&a, &p))
        goto fail;
    if (!a.arr[A_G]) {
        PyErr_SetString(PyExc_TypeError, "G is required");
        goto fail;
    }
    /* each gradient shaped like its input */
    const int sources[GR_COUNT] = {A_Q, A_K, A_POS_Q, A_POS_K, A_TABLE, A_VQ, A_VK, A_SEG_TABLE, A_THETA};
    const int typenum = p.dtype == POSENC_F32 ? NPY_FLOAT : NPY_DOUBLE;
    for (int t = 0; t < GR_COUNT; ++t) {
        PyArrayObject *src = a.arr[sources[t]];
        if (!src || !(needs & (1u << t)))
            continue;
        grads[t] = (PyArrayObject *)PyArray_SimpleNew(PyArray_NDIM(src), PyArray_DIMS(src), typenum);
        if (!grads[t])
            goto fail;
    }
    posenc_grads g;
#define GRAD_DATA(t) (grads[t] ? PyArray_DATA(grads[t]) : NULL)
    g.q = GRAD_DATA(GR_Q);
    g.k = GRAD_DATA(GR_K);
    g.pos_q = GRAD_DATA(GR_POS_Q);
    g.pos_k = GRAD_DATA(GR_POS_K);
    g.table = GRAD_DATA(GR_TABLE);
    g.vq_table = GRAD_DATA(GR_VQ);
    g.vk_table = GRAD_DATA(GR_VK);
    g.seg_table = GRAD_DATA(GR_SEG);
    g.theta = GRAD_DATA(GR_THETA);
#undef GRAD_DATA
    int status;
    const int threads = num_threads;
    const void *grad_logits = PyArray_DATA(a.arr[A_G]);
    Py_BEGIN_ALLOW_THREADS
    status = posenc_backward(&p, grad_logits, &g, threads);
    Py_END_ALLOW_THREADS
    if (raise_status(status))
        goto fail;
    result = PyTuple_New(GR_COUNT);
    if (!result)
        goto fail;
    for (int t = 0; t < GR_COUNT; ++t) {
        PyObject *item = grads[t] ? (PyObject *)grads[t] : Py_None;
        if (!grads[t])
            Py_INCREF(Py_None);
        grads[t] = NULL;  /* the tuple owns it now */
        PyTuple_SET_ITEM(result, t, item);
    }
    release(&a);
    return result;
fail:
    for (int t = 0; t < GR_COUNT; ++t)
        Py_XDECREF(grads[t]);
    release(&a);
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

static PyObject *py_capabilities(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return isa_list(posenc_isa_supported);
}

static PyObject *py_compiled_isas(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return isa_list(posenc_isa_compiled);
}

static PyObject *py_get_isa(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(posenc_isa_name(posenc_get_isa()));
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg)
{
    (void)self;
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
    (void)self;
    const long value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred())
        return NULL;
    if (value < 1 || value > 4096) {
        PyErr_Format(PyExc_ValueError, "threads must be in [1, 4096], got %ld", value);
        return NULL;
    }
    num_threads = (int)value;
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyLong_FromLong(num_threads);
}

static PyObject *py_build_info(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
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

static int dtype_from_name(const char *name)
{
    if (strcmp(name, "float32") == 0) return POSENC_F32;
    if (strcmp(name, "float64") == 0) return POSENC_F64;
    return -1;
}

static PyObject *py_measure_fma(PyObject *self, PyObject *args)
{
    const char *isa_name, *dtype_name;
    int threads;
    double seconds;
    (void)self;
    if (!PyArg_ParseTuple(args, "ssid", &isa_name, &dtype_name, &threads, &seconds))
        return NULL;
    const int isa = posenc_isa_from_name(isa_name), dtype = dtype_from_name(dtype_name);
    if (isa < 0 || !posenc_isa_supported((posenc_isa)isa) || dtype < 0 || threads < 1) {
        PyErr_Format(PyExc_ValueError, "measure_fma: unsupported isa %s / dtype %s / threads %d",
                     isa_name, dtype_name, threads);
        return NULL;
    }
    double flops;
    Py_BEGIN_ALLOW_THREADS
    flops = posenc_measure_fma((posenc_isa)isa, (posenc_dtype)dtype, threads, seconds);
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(flops);
}

static PyObject *py_measure_store(PyObject *self, PyObject *args)
{
    const char *isa_name;
    Py_ssize_t bytes;
    int threads, nontemporal, repeats;
    (void)self;
    if (!PyArg_ParseTuple(args, "snipi", &isa_name, &bytes, &threads, &nontemporal, &repeats))
        return NULL;
    const int isa = posenc_isa_from_name(isa_name);
    if (isa < 0 || !posenc_isa_supported((posenc_isa)isa) || bytes <= 0 || threads < 1 || repeats < 1) {
        PyErr_SetString(PyExc_ValueError, "measure_store: bad arguments");
        return NULL;
    }
    double rate;
    Py_BEGIN_ALLOW_THREADS
    rate = posenc_measure_store((posenc_isa)isa, (size_t)bytes, threads, nontemporal, repeats);
    Py_END_ALLOW_THREADS
    if (rate < 0)
        return PyErr_NoMemory();
    return PyFloat_FromDouble(rate);
}

static PyMethodDef methods[] = {
    {"forward", (PyCFunction)(void (*)(void))py_forward, METH_VARARGS | METH_KEYWORDS, forward_doc},
    {"backward", (PyCFunction)(void (*)(void))py_backward, METH_VARARGS | METH_KEYWORDS, backward_doc},
    {"capabilities", py_capabilities, METH_NOARGS, "ISAs this CPU and OS support, compiled in."},
    {"compiled_isas", py_compiled_isas, METH_NOARGS, "ISAs compiled into this build."},
    {"get_isa", py_get_isa, METH_NOARGS, "The ISA whose kernels run."},
    {"set_isa", py_set_isa, METH_O, "Select the ISA by name (ValueError if unsupported)."},
    {"set_num_threads", py_set_num_threads, METH_O, "Threads of every kernel call."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "Threads of every kernel call."},
    {"build_info", py_build_info, METH_NOARGS, "Compiler, OpenMP and compiled ISAs."},
    {"measure_fma", py_measure_fma, METH_VARARGS,
     "measure_fma(isa, dtype, threads, seconds) -> FLOP/s of the ISA's FMA loop."},
    {"measure_store", py_measure_store, METH_VARARGS,
     "measure_store(isa, bytes, threads, nontemporal, repeats) -> bytes/s of storing a buffer."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "posenc._C",
                                    "posenc's C engine (private: use the posenc package).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__C(void)
{
    import_array();
    posenc_dispatch_init();
    num_threads = posenc_default_threads();
    return PyModule_Create(&module);
}
