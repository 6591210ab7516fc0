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

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

static int num_threads = 1;

/*
 * The fields of an EngineConfig (posenc/_engine.py), in its order: the
 * binding reads any tuple of exactly CF_COUNT items positionally.
 */
enum {
    CF_Q, CF_K, CF_PRODUCT, CF_SCALE, CF_POS_Q, CF_POS_K, CF_DENSE_SCALE, CF_TABLE, CF_TABLE_MAP,
    CF_QUERY_TABLE, CF_QUERY_MAP, CF_KEY_TABLE, CF_KEY_MAP, CF_VECTOR_SCALE, CF_SEGMENT_Q,
    CF_SEGMENT_K, CF_SEGMENT_TABLE, CF_THETA, CF_QUERY_OFFSET, CF_COUNT
};

static const char *const config_names[CF_COUNT] = {
    "q", "k", "product", "scale", "pos_q", "pos_k", "dense_scale", "table", "table_map",
    "query_table", "query_map", "key_table", "key_map", "vector_scale", "segment_q", "segment_k",
    "segment_table", "theta", "query_offset"};

/* Gradient outputs, in the order backward returns them (_engine.ENGINE_GRADS). */
enum { GR_Q, GR_K, GR_POS_Q, GR_POS_K, GR_TABLE, GR_QUERY_TABLE, GR_KEY_TABLE, GR_SEGMENT_TABLE,
       GR_THETA, GR_COUNT };

/* The config field each gradient is shaped like. */
static const int grad_source[GR_COUNT] = {CF_Q, CF_K, CF_POS_Q, CF_POS_K, CF_TABLE,
                                          CF_QUERY_TABLE, CF_KEY_TABLE, CF_SEGMENT_TABLE, CF_THETA};

/* Every array a call converts (one per config field), released on the one exit path. */
typedef struct {
    PyArrayObject *arr[CF_COUNT];
} converted;

static void release(converted *a)
{
    for (int t = 0; t < CF_COUNT; ++t)
        Py_XDECREF(a->arr[t]);
}

/* An aligned, native-endian, C-contiguous array of `typenum` (STYLE.md 6):
 * obj itself when it already is one (the common case, no call into NumPy's
 * converter), else a copy.  NULL with an exception. */
static PyArrayObject *as_float_array(PyObject *obj, int typenum, const char *name)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, got %s", name,
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (PyArray_TYPE(arr) != typenum) {
        PyErr_Format(PyExc_TypeError, "%s must have dtype %s like q", name,
                     typenum == NPY_FLOAT ? "float32" : "float64");
        return NULL;
    }
    if (PyArray_ISCARRAY_RO(arr) && PyArray_ISNOTSWAPPED(arr)) {
        Py_INCREF(obj);
        return arr;
    }
    return (PyArrayObject *)PyArray_FROM_OTF(obj, typenum, NPY_ARRAY_IN_ARRAY);
}

/* Bucket maps and segment ids: any integer dtype, as int64 (the values are
 * range-checked by posenc_validate). */
static PyArrayObject *as_index_array(PyObject *obj, const char *name)
{
    if (!PyArray_Check(obj) || !PyArray_ISINTEGER((PyArrayObject *)obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an integer numpy.ndarray", name);
        return NULL;
    }
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (PyArray_TYPE(arr) == NPY_INT64 && PyArray_ISCARRAY_RO(arr) && PyArray_ISNOTSWAPPED(arr)) {
        Py_INCREF(obj);
        return arr;
    }
    return (PyArrayObject *)PyArray_FROM_OTF(obj, NPY_INT64, NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
}

/* arr has ndim dimensions, each equal to want[t] where want[t] >= 0. */
static int check_dims(PyArrayObject *arr, const char *name, int ndim, const npy_intp *want)
{
    if (PyArray_NDIM(arr) == ndim) {
        int t = 0;
        while (t < ndim && (want[t] < 0 || PyArray_DIM(arr, t) == want[t]))
            ++t;
        if (t == ndim)
            return 0;
    }
    PyErr_Format(PyExc_ValueError, "%s has an inconsistent shape (%d dimensions)", name,
                 PyArray_NDIM(arr));
    return -1;
}

/* query_offset: an int >= 0. */
static int read_size(PyObject *config, int field, size_t *value)
{
    PyObject *obj = PyTuple_GET_ITEM(config, field);
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", config_names[field]);
        return -1;
    }
    const Py_ssize_t v = PyLong_AsSsize_t(obj);
    if (v < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be an int >= 0", config_names[field]);
        return -1;
    }
    *value = (size_t)v;
    return 0;
}

static int read_double(PyObject *config, int field, double *value)
{
    *value = PyFloat_AsDouble(PyTuple_GET_ITEM(config, field));
    if (*value == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "%s must be a float", config_names[field]);
        return -1;
    }
    return 0;
}

#define DATA(field) ((const void *)PyArray_DATA(a->arr[field]))
#define DIM(field, t) ((size_t)PyArray_DIM(a->arr[field], (t)))

/*
 * Convert every field of `config` and fill the problem, then validate it:
 * the one validation of a call.  0, or -1 with an exception.
 */
static int build_problem(PyObject *config, converted *a, posenc_problem *p)
{
    memset(p, 0, sizeof *p);
    if (!PyTuple_Check(config) || PyTuple_GET_SIZE(config) != CF_COUNT) {
        PyErr_Format(PyExc_TypeError, "config must be an EngineConfig (a tuple of %d items)",
                     (int)CF_COUNT);
        return -1;
    }
    PyObject *q = PyTuple_GET_ITEM(config, CF_Q);
    if (!PyArray_Check(q)) {
        PyErr_SetString(PyExc_TypeError, "q must be a numpy.ndarray");
        return -1;
    }
    const int typenum = PyArray_TYPE((PyArrayObject *)q);
    if (typenum != NPY_FLOAT && typenum != NPY_DOUBLE) {
        PyErr_SetString(PyExc_TypeError, "q must have dtype float32 or float64");
        return -1;
    }
    static const int index_fields[] = {CF_TABLE_MAP, CF_QUERY_MAP, CF_KEY_MAP, CF_SEGMENT_Q,
                                       CF_SEGMENT_K};
    static const int float_fields[] = {CF_Q, CF_K, CF_POS_Q, CF_POS_K, CF_TABLE, CF_QUERY_TABLE,
                                       CF_KEY_TABLE, CF_SEGMENT_TABLE, CF_THETA};
    for (size_t t = 0; t < sizeof float_fields / sizeof float_fields[0]; ++t) {
        const int field = float_fields[t];
        PyObject *obj = PyTuple_GET_ITEM(config, field);
        if (obj != Py_None && !(a->arr[field] = as_float_array(obj, typenum, config_names[field])))
            return -1;
    }
    for (size_t t = 0; t < sizeof index_fields / sizeof index_fields[0]; ++t) {
        const int field = index_fields[t];
        PyObject *obj = PyTuple_GET_ITEM(config, field);
        if (obj != Py_None && !(a->arr[field] = as_index_array(obj, config_names[field])))
            return -1;
    }
    int product = PyObject_IsTrue(PyTuple_GET_ITEM(config, CF_PRODUCT));
    if (product < 0 || read_double(config, CF_SCALE, &p->scale) ||
        read_double(config, CF_DENSE_SCALE, &p->dense_scale) ||
        read_double(config, CF_VECTOR_SCALE, &p->vector_scale) ||
        read_size(config, CF_QUERY_OFFSET, &p->query_offset))
        return -1;
    if (!a->arr[CF_K]) {
        PyErr_SetString(PyExc_TypeError, "k is required");
        return -1;
    }

    const npy_intp any = -1;
    if (check_dims(a->arr[CF_Q], "q", 4, (npy_intp[]){any, any, any, any}))
        return -1;
    const npy_intp B = PyArray_DIM(a->arr[CF_Q], 0), H = PyArray_DIM(a->arr[CF_Q], 1);
    const npy_intp n = PyArray_DIM(a->arr[CF_Q], 2), d = PyArray_DIM(a->arr[CF_Q], 3);
    if (check_dims(a->arr[CF_K], "k", 4, (npy_intp[]){B, H, any, d}))
        return -1;
    const npy_intp m = PyArray_DIM(a->arr[CF_K], 2);
    const npy_intp offsets = (n > 0 && m > 0) ? n + m - 1 : 0;
    if (a->arr[CF_POS_Q] || a->arr[CF_POS_K]) {
        if (!a->arr[CF_POS_Q] || !a->arr[CF_POS_K]) {
            PyErr_SetString(PyExc_ValueError, "pos_q and pos_k come together");
            return -1;
        }
        if (check_dims(a->arr[CF_POS_Q], "pos_q", 3, (npy_intp[]){any, n, any}))
            return -1;
        const npy_intp dp = PyArray_DIM(a->arr[CF_POS_Q], 2);
        if (check_dims(a->arr[CF_POS_K], "pos_k", 3, (npy_intp[]){any, m, dp}))
            return -1;
        p->pos_q = DATA(CF_POS_Q);
        p->pos_k = DATA(CF_POS_K);
        p->pos_q_heads = DIM(CF_POS_Q, 0);
        p->pos_k_heads = DIM(CF_POS_K, 0);
        p->d_p = (size_t)dp;
    }
    /* tables with their maps */
    static const struct { int table, map, ndim; } tables[3] = {
        {CF_TABLE, CF_TABLE_MAP, 2}, {CF_QUERY_TABLE, CF_QUERY_MAP, 3}, {CF_KEY_TABLE, CF_KEY_MAP, 3}};
    for (int t = 0; t < 3; ++t) {
        const int table = tables[t].table, map = tables[t].map;
        if (!a->arr[table])
            continue;
        if (!a->arr[map]) {
            PyErr_Format(PyExc_ValueError, "%s needs %s", config_names[table], config_names[map]);
            return -1;
        }
        if (check_dims(a->arr[table], config_names[table], tables[t].ndim, (npy_intp[]){any, any, d}) ||
            check_dims(a->arr[map], config_names[map], 1, (npy_intp[]){offsets}))
            return -1;
    }
    if (a->arr[CF_TABLE]) {
        p->table = DATA(CF_TABLE);
        p->table_heads = DIM(CF_TABLE, 0);
        p->table_rows = DIM(CF_TABLE, 1);
        p->table_map = (const int64_t *)DATA(CF_TABLE_MAP);
    }
    if (a->arr[CF_QUERY_TABLE]) {
        p->query_table = DATA(CF_QUERY_TABLE);
        p->query_table_heads = DIM(CF_QUERY_TABLE, 0);
        p->query_table_rows = DIM(CF_QUERY_TABLE, 1);
        p->query_map = (const int64_t *)DATA(CF_QUERY_MAP);
    }
    if (a->arr[CF_KEY_TABLE]) {
        p->key_table = DATA(CF_KEY_TABLE);
        p->key_table_heads = DIM(CF_KEY_TABLE, 0);
        p->key_table_rows = DIM(CF_KEY_TABLE, 1);
        p->key_map = (const int64_t *)DATA(CF_KEY_MAP);
    }
    if (a->arr[CF_SEGMENT_TABLE] || a->arr[CF_SEGMENT_Q] || a->arr[CF_SEGMENT_K]) {
        if (!a->arr[CF_SEGMENT_TABLE] || !a->arr[CF_SEGMENT_Q] || !a->arr[CF_SEGMENT_K]) {
            PyErr_SetString(PyExc_ValueError, "segment_q, segment_k and segment_table come together");
            return -1;
        }
        if (check_dims(a->arr[CF_SEGMENT_TABLE], "segment_table", 3, (npy_intp[]){any, any, any}))
            return -1;
        const npy_intp S = PyArray_DIM(a->arr[CF_SEGMENT_TABLE], 1);
        if (check_dims(a->arr[CF_SEGMENT_TABLE], "segment_table", 3, (npy_intp[]){any, S, S}) ||
            check_dims(a->arr[CF_SEGMENT_Q], "segment_q", 2, (npy_intp[]){B, n}) ||
            check_dims(a->arr[CF_SEGMENT_K], "segment_k", 2, (npy_intp[]){B, m}))
            return -1;
        p->segment_table = DATA(CF_SEGMENT_TABLE);
        p->segment_q = (const int64_t *)DATA(CF_SEGMENT_Q);
        p->segment_k = (const int64_t *)DATA(CF_SEGMENT_K);
        p->segment_table_heads = DIM(CF_SEGMENT_TABLE, 0);
        p->n_segments = (size_t)S;
    }
    if (a->arr[CF_THETA]) {
        if (check_dims(a->arr[CF_THETA], "theta", 2, (npy_intp[]){any, 2}))
            return -1;
        p->theta = DATA(CF_THETA);
        p->theta_heads = DIM(CF_THETA, 0);
    }
    p->dtype = typenum == NPY_FLOAT ? POSENC_F32 : POSENC_F64;
    p->product = product;
    p->B = (size_t)B;
    p->H = (size_t)H;
    p->n = (size_t)n;
    p->m = (size_t)m;
    p->d = (size_t)d;
    p->q = DATA(CF_Q);
    p->k = DATA(CF_K);
    const char *why = NULL;
    if (posenc_validate(p, &why) != POSENC_OK) {
        PyErr_Format(PyExc_ValueError, "inconsistent problem: %s", why);
        return -1;
    }
    return 0;
}

#undef DATA
#undef DIM

/* ------------------------------------------------------------ results */

/*
 * Large results (RESULT_BLOCK_BYTES and up) live in blocks of their own:
 * 64-byte aligned (the engine streams them to memory) and owned by a
 * ResultBlock, the array's base.  When the array and its views die the block
 * goes back to a small cache instead of to the OS, and the next result of a
 * similar size reuses memory that is already faulted in.  A fresh 100 MB
 * result costs ~25k page faults, or with huge pages (advised, as NumPy
 * does: 8x fewer fault costs) now and then a compaction stall of 100 ms
 * and more; a cached block costs nothing.  The cache keeps at most
 * RESULT_CACHE_SLOTS blocks and result_cache_budget bytes
 * (posenc.set_result_cache, POSENC_RESULT_CACHE); the GIL guards it.
 */
#define RESULT_BLOCK_BYTES POSENC_STREAM_BYTES
#define RESULT_BLOCK_ROUND ((size_t)2 << 20)      /* a huge page */
#define RESULT_CACHE_SLOTS 4
#define RESULT_CACHE_DEFAULT ((size_t)256 << 20)

typedef struct {
    void *data;
    size_t bytes;                 /* a multiple of RESULT_BLOCK_ROUND */
} result_block;

static result_block result_cache[RESULT_CACHE_SLOTS];   /* oldest first */
static size_t result_cache_count, result_cache_bytes;
static size_t result_cache_budget = RESULT_CACHE_DEFAULT;

static void *block_map(size_t bytes)
{
#ifdef MAP_ANONYMOUS
    void *data = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(data, bytes, MADV_HUGEPAGE);   /* advice only: failure changes nothing */
#endif
    return data;
#else
    return aligned_alloc(RESULT_BLOCK_ROUND, bytes);
#endif
}

static void block_unmap(result_block block)
{
#ifdef MAP_ANONYMOUS
    munmap(block.data, block.bytes);
#else
    free(block.data);
#endif
}

static void cache_evict_oldest(void)
{
    block_unmap(result_cache[0]);
    result_cache_bytes -= result_cache[0].bytes;
    --result_cache_count;
    memmove(result_cache, result_cache + 1, result_cache_count * sizeof result_cache[0]);
}

/* A cached block for `bytes` (the smallest that holds them, at most twice
 * as large), else a new one; {NULL, 0} when out of memory. */
static result_block block_take(size_t bytes)
{
    size_t best = result_cache_count;
    for (size_t t = 0; t < result_cache_count; ++t)
        if (result_cache[t].bytes >= bytes && result_cache[t].bytes / 2 <= bytes &&
            (best == result_cache_count || result_cache[t].bytes < result_cache[best].bytes))
            best = t;
    if (best < result_cache_count) {
        const result_block block = result_cache[best];
        result_cache_bytes -= block.bytes;
        --result_cache_count;
        memmove(result_cache + best, result_cache + best + 1,
                (result_cache_count - best) * sizeof result_cache[0]);
        return block;
    }
    const result_block block = {block_map(bytes), bytes};
    return block.data ? block : (result_block){NULL, 0};
}

/* Keep a block that a result no longer uses, evicting the oldest to stay
 * within the budget; one larger than the budget goes to the OS. */
static void block_give_back(result_block block)
{
    if (block.bytes > result_cache_budget) {
        block_unmap(block);
        return;
    }
    while (result_cache_count == RESULT_CACHE_SLOTS ||
           result_cache_bytes + block.bytes > result_cache_budget)
        cache_evict_oldest();
    result_cache[result_cache_count++] = block;
    result_cache_bytes += block.bytes;
}

typedef struct {
    PyObject_HEAD
    result_block block;
} ResultBlock;

static void result_block_dealloc(PyObject *self)
{
    block_give_back(((ResultBlock *)self)->block);
    Py_TYPE(self)->tp_free(self);
}

static PyTypeObject ResultBlock_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "posenc._C.ResultBlock",
    .tp_basicsize = sizeof(ResultBlock),
    .tp_dealloc = result_block_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The memory of a large posenc result (its base); back to posenc's cache when freed.",
};

/* MemoryError naming the shape of a result that cannot be allocated. */
static void raise_result_memory(int ndim, const npy_intp *dims, int typenum, size_t bytes)
{
    PyObject *shape = PyTuple_New(ndim);
    for (int t = 0; shape && t < ndim; ++t)
        PyTuple_SET_ITEM(shape, t, PyLong_FromSsize_t(dims[t]));
    if (!shape)
        return;
    const char *dtype = typenum == NPY_FLOAT ? "float32" : "float64";
    if (bytes > (size_t)NPY_MAX_INTP)
        PyErr_Format(PyExc_MemoryError,
                     "the result of shape %R (%s) does not fit in memory: more than %zd bytes",
                     shape, dtype, (Py_ssize_t)NPY_MAX_INTP);
    else
        PyErr_Format(PyExc_MemoryError, "cannot allocate the result of shape %R (%s): %zu bytes",
                     shape, dtype, bytes);
    Py_DECREF(shape);
}

/*
 * A new C-contiguous result: a plain NumPy array when small, else an array
 * over a result block (above).  Its size is computed without overflow: one
 * that does not fit is a MemoryError naming the shape.
 */
static PyArrayObject *new_result(int ndim, const npy_intp *dims, int typenum)
{
    const size_t itemsize = typenum == NPY_FLOAT ? sizeof(float) : sizeof(double);
    const size_t too_large = (size_t)NPY_MAX_INTP + 1;
    size_t bytes = itemsize;
    int empty = 0;
    for (int t = 0; t < ndim; ++t) {
        empty |= dims[t] == 0;
        bytes = bytes > too_large / (size_t)(dims[t] ? dims[t] : 1) ? too_large
                                                                     : bytes * (size_t)dims[t];
    }
    if (empty)
        bytes = 0;
    if (bytes > (size_t)NPY_MAX_INTP - RESULT_BLOCK_ROUND) {
        raise_result_memory(ndim, dims, typenum, bytes);
        return NULL;
    }
    if (bytes < RESULT_BLOCK_BYTES) {
        PyArrayObject *array = (PyArrayObject *)PyArray_SimpleNew(ndim, (npy_intp *)dims, typenum);
        if (!array && PyErr_ExceptionMatches(PyExc_MemoryError)) {
            PyErr_Clear();
            raise_result_memory(ndim, dims, typenum, bytes);
        }
        return array;
    }
    ResultBlock *owner = PyObject_New(ResultBlock, &ResultBlock_Type);
    if (!owner)
        return NULL;
    owner->block = block_take((bytes + RESULT_BLOCK_ROUND - 1) / RESULT_BLOCK_ROUND * RESULT_BLOCK_ROUND);
    if (!owner->block.data) {
        PyObject_Free(owner);
        raise_result_memory(ndim, dims, typenum, bytes);
        return NULL;
    }
    PyArrayObject *array = (PyArrayObject *)PyArray_New(&PyArray_Type, ndim, (npy_intp *)dims, typenum,
                                                        NULL, owner->block.data, 0, NPY_ARRAY_CARRAY, NULL);
    if (!array || PyArray_SetBaseObject(array, (PyObject *)owner) < 0) {   /* steals owner */
        Py_XDECREF(array);
        if (!array)
            Py_DECREF(owner);
        return NULL;
    }
    return array;
}

/* Set the cache's budget in bytes (0: no cache), freeing what exceeds it. */
static void result_cache_set(size_t budget)
{
    result_cache_budget = budget;
    while (result_cache_count && result_cache_bytes > result_cache_budget)
        cache_evict_oldest();
}

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
    const int typenum = p.dtype == POSENC_F32 ? NPY_FLOAT : NPY_DOUBLE;
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
 * grads and g.  M4, M4M: when key_table is query_table and key_map is
 * query_map (one table read on both sides), one gradient, in the
 * query_table entry, that the engine sums both sides into (the two outputs
 * are the same buffer); either bit asks for it.  0, or -1 with an exception.
 */
static int new_grads(PyObject *config, const converted *a, unsigned int needs, int typenum,
                     PyArrayObject **grads, posenc_grads *g)
{
    const int shared_table = a->arr[CF_KEY_TABLE] &&
                             PyTuple_GET_ITEM(config, CF_KEY_TABLE) == PyTuple_GET_ITEM(config, CF_QUERY_TABLE) &&
                             PyTuple_GET_ITEM(config, CF_KEY_MAP) == PyTuple_GET_ITEM(config, CF_QUERY_MAP);
    if (shared_table && (needs & (1u << GR_KEY_TABLE))) {
        needs |= 1u << GR_QUERY_TABLE;
        needs &= ~(1u << GR_KEY_TABLE);
    }
    void *data[GR_COUNT] = {NULL};
    for (int t = 0; t < GR_COUNT; ++t) {
        PyArrayObject *src = a->arr[grad_source[t]];
        if (!src || !(needs & (1u << t)))
            continue;
        if (!(grads[t] = new_result(PyArray_NDIM(src), PyArray_DIMS(src), typenum)))
            return -1;
        data[t] = PyArray_DATA(grads[t]);
    }
    *g = (posenc_grads){data[GR_Q], data[GR_K], data[GR_POS_Q], data[GR_POS_K], data[GR_TABLE],
                        data[GR_QUERY_TABLE],
                        shared_table ? data[GR_QUERY_TABLE] : data[GR_KEY_TABLE],
                        data[GR_SEGMENT_TABLE], data[GR_THETA]};
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
 * a 9-tuple in ENGINE_GRADS order, None where absent or not in `needs`.
 * When key_table is query_table and key_map is query_map (one table on both
 * sides), both sides' gradients are summed into the query_table entry and
 * the key_table entry is None; either bit asks for it.
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
    const int typenum = p.dtype == POSENC_F32 ? NPY_FLOAT : NPY_DOUBLE;
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

static PyObject *py_set_result_cache(PyObject *self, PyObject *arg)
{
    const long long value = PyLong_AsLongLong(arg);
    if (value == -1 && PyErr_Occurred())
        return NULL;
    if (value < 0) {
        PyErr_Format(PyExc_ValueError, "the result cache must be >= 0 bytes, got %lld", value);
        return NULL;
    }
    result_cache_set((size_t)value);
    Py_RETURN_NONE;
}

static PyObject *py_result_cache_info(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("{s:n,s:n,s:n}", "budget", (Py_ssize_t)result_cache_budget, "blocks",
                         (Py_ssize_t)result_cache_count, "bytes", (Py_ssize_t)result_cache_bytes);
}

/* POSENC_RESULT_CACHE: bytes, with an optional K, M or G (binary units);
 * anything else warns and leaves the default. */
static int result_cache_from_env(void)
{
    const char *text = getenv("POSENC_RESULT_CACHE");
    if (!text || !*text)
        return 0;
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    const int shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20
                    : *end == 'G' || *end == 'g' ? 30 : 0;
    end += shift != 0;
    if (errno || end == text || *end || text[0] == '-' || value > ((unsigned long long)NPY_MAX_INTP >> shift))
        return PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                                "POSENC_RESULT_CACHE=%s is not a size in bytes (e.g. 268435456 or "
                                "256M); the result cache keeps its default of %zu bytes",
                                text, (size_t)RESULT_CACHE_DEFAULT);
    result_cache_set((size_t)(value << shift));
    return 0;
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
     "None where absent or not in the bit mask `needs`; one table on both sides (key_table\n"
     "is query_table, key_map is query_map) gives one gradient, in the query_table entry.\n"
     "Private: use the posenc package."},
    {"attention_forward", (PyCFunction)(void (*)(void))py_attention_forward, METH_FASTCALL,
     "attention_forward(config, v, key_padding_mask, causal, dropout_p, seed, out)\n\n"
     "The fused attention (SPEC 6) of one EngineConfig: (out (B, H, n, dv), lse (B, H, n)).\n"
     "Private: use the posenc package."},
    {"attention_backward", (PyCFunction)(void (*)(void))py_attention_backward, METH_FASTCALL,
     "attention_backward(d_out, config, v, out, lse, key_padding_mask, causal, dropout_p, seed,\n"
     "needs)\n\nThe 9 gradients of backward, then dv (bit 9 of needs).  Private: use the\n"
     "posenc package."},
    {"capabilities", py_capabilities, METH_NOARGS, "ISAs this CPU and OS support, compiled in."},
    {"compiled_isas", py_compiled_isas, METH_NOARGS, "ISAs compiled into this build."},
    {"get_isa", py_get_isa, METH_NOARGS, "The ISA whose kernels run."},
    {"set_isa", py_set_isa, METH_O, "Select the ISA by name (ValueError if unsupported)."},
    {"set_num_threads", py_set_num_threads, METH_O, "Threads of every kernel call."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "Threads of every kernel call."},
    {"build_info", py_build_info, METH_NOARGS, "Compiler, OpenMP and compiled ISAs."},
    {"set_result_cache", py_set_result_cache, METH_O,
     "Bytes of freed large results kept for reuse (0: none)."},
    {"result_cache_info", py_result_cache_info, METH_NOARGS,
     "The result cache: its budget, and the blocks and bytes it holds now."},
    {NULL, NULL, 0, NULL}};

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
    PyObject *mod = PyModule_Create(&module);
    /* the binding takes an EngineConfig (posenc/_engine.py) */
    if (mod && PyModule_AddIntConstant(mod, "ENGINE_CONFIG_BINDING", 1) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
