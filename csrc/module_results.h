/*
 * module_results.h -- posenc._C's result arrays: small ones NumPy's own,
 * large ones in cached, 64-byte aligned blocks; and the cache's Python
 * functions.  Included by module.c (one translation unit: the binding).
 */
#include <errno.h>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

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
    const char *dtype = typenum_name(typenum);
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
    const size_t itemsize = typenum_itemsize(typenum);
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
