/*
 * module_config.h -- posenc._C's reading of an EngineConfig
 * (posenc/_engine.py) into a posenc_problem: each array converted once
 * (aligned, native, C-contiguous: the engine indexes raw memory), shapes
 * checked, then the one posenc_validate of a call, so the engine can never
 * read out of bounds.
 * Included by module.c (one translation unit: the binding).
 */

/*
 * The fields of an EngineConfig, in its order (posenc._engine reads their
 * names from _C.CONFIG_FIELDS): the binding reads any tuple of exactly
 * CF_COUNT items positionally.  The float arrays are q, k and posenc.h's
 * POSENC_ARRAYS (the rotation's tables); then the integer arrays (the rotation's
 * positions), the scalars, and the term modules' arrays (csrc/terms.h:
 * <kind>_<array>, (B|1, H|1, length)).
 */
#define CONFIG_INDEX_FIELDS(X) \
    X(positions_q) X(positions_k)
#define CONFIG_SCALAR_FIELDS(X) \
    X(product) X(scale) X(dense_scale) X(vector_scale) X(rope_interleaved) X(query_offset)

#define CF_ENUM_(name, ...) CF_##name,
#define CF_TERM_ENUM_(kind, name, required, grad, length, real) CF_##kind##_##name,
#define CF_TERM_NAME_(kind, name, required, grad, length, real) #kind "_" #name,
#define GR_TERM_NAME_(kind, name, required, grad, length, real) POSENC_TERM_IF_##grad(#kind "_" #name,)
#define CF_TERM_SKIP_(name, valid, why, ARRAYS) ARRAYS
enum {
    CF_q, CF_k,
    POSENC_ARRAYS(CF_ENUM_)
    CF_FIRST_INDEX_,
    CF_INDEX_BEFORE_ = CF_FIRST_INDEX_ - 1,
    CONFIG_INDEX_FIELDS(CF_ENUM_)
    CONFIG_SCALAR_FIELDS(CF_ENUM_)
    POSENC_TERMS(CF_TERM_SKIP_, CF_TERM_ENUM_)
    CF_COUNT
};

#define CF_NAME_(name, ...) #name,
static const char *const config_names[CF_COUNT] = {
    "q", "k", POSENC_ARRAYS(CF_NAME_) CONFIG_INDEX_FIELDS(CF_NAME_)
    CONFIG_SCALAR_FIELDS(CF_NAME_) POSENC_TERMS(CF_TERM_SKIP_, CF_TERM_NAME_)};

/* The float and the integer array fields. */
static const int float_fields[] = {CF_q, CF_k, POSENC_ARRAYS(CF_ENUM_)};
#define CF_INDEX_(name) CF_##name,
static const int index_fields[] = {CONFIG_INDEX_FIELDS(CF_INDEX_)};
#undef CF_INDEX_

/* Gradient outputs, in the order backward returns them (_C.ENGINE_GRADS):
 * q, k, then the term modules' arrays with one. */
#define GR_TERM_ENUM_(kind, name, required, grad, length, real) POSENC_TERM_IF_##grad(GR_##kind##_##name,)
enum { GR_q, GR_k, GR_FIRST_TERM_, GR_TERM_BEFORE_ = GR_FIRST_TERM_ - 1,
       POSENC_TERMS(CF_TERM_SKIP_, GR_TERM_ENUM_) GR_COUNT };
#undef GR_TERM_ENUM_
#undef CF_ENUM_
#undef CF_TERM_ENUM_

/* The config field each gradient is shaped like, and the gradients' names. */
#define GR_TERM_SOURCE_(kind, name, required, grad, length, real) POSENC_TERM_IF_##grad(CF_##kind##_##name,)
static const int grad_source[GR_COUNT] = {CF_q, CF_k, POSENC_TERMS(CF_TERM_SKIP_, GR_TERM_SOURCE_)};
#undef GR_TERM_SOURCE_
static const char *const grad_names[GR_COUNT] = {"q", "k",
                                                 POSENC_TERMS(CF_TERM_SKIP_, GR_TERM_NAME_)};
#undef CF_NAME_

/* The term modules' arrays: their config fields, kinds, whether they have a gradient (then
 * the next GR_ entry from GR_FIRST_TERM_), in order. */
#define TERM_FIELD_(kind, name, required, grad, length, real) {CF_##kind##_##name, POSENC_TERM_##kind, grad, real},
static const struct { int field, kind, grad, real; } term_fields[] = {POSENC_TERMS(CF_TERM_SKIP_, TERM_FIELD_)};

/* The length (elements per unit) term_fields[t]'s array must have in p, or 0 (any). */
static size_t term_field_length(const posenc_problem *p, int t)
{
    int at = 0;
#define TERM_LENGTH_(kind, name, required, grad, length, real) if (at++ == t) return (size_t)(length);
    POSENC_TERMS(CF_TERM_SKIP_, TERM_LENGTH_)
#undef TERM_LENGTH_
    return 0;
}
#undef TERM_FIELD_
#undef GR_TERM_NAME_
#define TERM_FIELD_COUNT ((int)(sizeof term_fields / sizeof term_fields[0]))

/* Every array a call converts (one per config field), released on the one exit path. */
typedef struct {
    PyArrayObject *arr[CF_COUNT];
} converted;

static void release(converted *a)
{
    for (int t = 0; t < CF_COUNT; ++t)
        Py_XDECREF(a->arr[t]);
}

/*
 * The float dtypes of a problem.  float16 is NumPy's NPY_HALF; bfloat16 is
 * ml_dtypes' user-defined NumPy dtype, whose type number NumPy assigns when
 * ml_dtypes registers it: posenc's Python side passes it in
 * (_C._set_bfloat16) when ml_dtypes imports, so -1 here means "no bfloat16
 * arrays can exist".  Both are 16-bit storage (posenc.h POSENC_BF16,
 * POSENC_F16); lse stays float32 for them.
 */
static int bfloat16_typenum = -1;

#define FLOAT_DTYPES_TEXT "float32, float64, bfloat16 (with ml_dtypes installed) or float16"

/* The posenc_dtype of an array type number; -1 when it is not one of the four. */
static int dtype_of(int typenum)
{
    if (typenum == NPY_FLOAT)
        return POSENC_F32;
    if (typenum == NPY_DOUBLE)
        return POSENC_F64;
    if (typenum == NPY_HALF)
        return POSENC_F16;
    if (typenum == bfloat16_typenum && typenum >= 0)
        return POSENC_BF16;
    return -1;
}

/* The array type number of a posenc_dtype (the inverse of dtype_of). */
static int typenum_of(posenc_dtype dtype)
{
    switch (dtype) {
    case POSENC_F32: return NPY_FLOAT;
    case POSENC_F64: return NPY_DOUBLE;
    case POSENC_F16: return NPY_HALF;
    default: return bfloat16_typenum;
    }
}

/* The dtype's name, and its item size in bytes. */
static const char *typenum_name(int typenum)
{
    static const char *const names[] = {"float32", "float64", "bfloat16", "float16"};
    const int dtype = dtype_of(typenum);
    return dtype < 0 ? "?" : names[dtype];
}

static size_t typenum_itemsize(int typenum)
{
    const int dtype = dtype_of(typenum);
    return dtype == POSENC_F64 ? sizeof(double) : dtype == POSENC_F32 ? sizeof(float) : 2;
}

/* The type number of lse: float32 for the 16-bit dtypes, else the problem's. */
static int lse_typenum(posenc_dtype dtype)
{
    return dtype == POSENC_F64 ? NPY_DOUBLE : NPY_FLOAT;
}

/* _set_bfloat16(num): ml_dtypes.bfloat16's NumPy type number (a registered
 * dtype of 2 bytes named bfloat16), called by posenc/__init__.py. */
static PyObject *py_set_bfloat16(PyObject *self, PyObject *arg)
{
    const long num = PyLong_AsLong(arg);
    if (num == -1 && PyErr_Occurred())
        return NULL;
    PyArray_Descr *descr = num >= NPY_USERDEF && num <= INT_MAX ? PyArray_DescrFromType((int)num)
                                                                     : NULL;
    if (!descr) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%ld is not a registered NumPy user dtype", num);
        return NULL;
    }
    const char *name = descr->typeobj->tp_name;
    const size_t length = strlen(name);
    const int ok = PyDataType_ELSIZE(descr) == 2 && length >= 8 &&
                   strcmp(name + length - 8, "bfloat16") == 0;
    Py_DECREF(descr);
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "NumPy dtype %ld is not a 2-byte bfloat16", num);
        return NULL;
    }
    bfloat16_typenum = (int)num;
    Py_RETURN_NONE;
}

/* 0 when obj is a numpy.ndarray of `typenum` (the dtype of the call's first
 * array, `first`), else -1 with a TypeError. */
static int check_float_array(PyObject *obj, int typenum, const char *name, const char *first)
{
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, got %s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyArray_TYPE((PyArrayObject *)obj) != typenum) {
        PyErr_Format(PyExc_TypeError, "%s must have dtype %s (from %s's), got %R", name,
                     typenum_name(typenum), first,
                     (PyObject *)PyArray_DESCR((PyArrayObject *)obj));
        return -1;
    }
    return 0;
}

/* An aligned, native-endian, C-contiguous array of `typenum` made of the array
 * obj (the engine indexes raw memory): obj itself when it already is one (the
 * common case, no call into NumPy's converter), else a copy cast to `typenum`.
 * NULL with an exception. */
static PyArrayObject *as_c_array(PyObject *obj, int typenum)
{
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (PyArray_TYPE(arr) == typenum && PyArray_ISCARRAY_RO(arr) && PyArray_ISNOTSWAPPED(arr)) {
        Py_INCREF(obj);
        return arr;
    }
    return (PyArrayObject *)PyArray_FROM_OTF(obj, typenum,
                                             NPY_ARRAY_IN_ARRAY | NPY_ARRAY_FORCECAST);
}

/* as_c_array of obj, a numpy.ndarray of `typenum` (the call's first array's dtype). */
static PyArrayObject *as_float_array(PyObject *obj, int typenum, const char *name)
{
    return check_float_array(obj, typenum, name, "q") ? NULL : as_c_array(obj, typenum);
}

/* An input the engine reads a unit at a time (q, k, v, d_out: posenc.h's posenc_strides),
 * checked as as_float_array: the array itself where it is 4-D, aligned, native-endian, of
 * `typenum`, its last axis contiguous and its rows apart (a transposed view, as HF models
 * hand q, k and v: no copy), its strides in elements in *s (r = 0: C-contiguous); else
 * as_c_array's copy.  NULL with an exception. */
static PyArrayObject *as_rows_array(PyObject *obj, int typenum, const char *name,
                                    posenc_strides *s)
{
    *s = (posenc_strides){0, 0, 0};
    if (check_float_array(obj, typenum, name, "q"))
        return NULL;
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (PyArray_NDIM(arr) == 4 && !PyArray_ISCARRAY_RO(arr) && PyArray_ISALIGNED(arr) &&
        PyArray_ISNOTSWAPPED(arr)) {
        const npy_intp item = PyArray_ITEMSIZE(arr), *st = PyArray_STRIDES(arr);
        if ((PyArray_DIM(arr, 3) <= 1 || st[3] == item) && st[0] % item == 0 &&
            st[1] % item == 0 && st[2] % item == 0 && st[2] != 0) {
            Py_INCREF(obj);
            *s = (posenc_strides){st[0] / item, st[1] / item, st[2] / item};
            return arr;
        }
    }
    return as_c_array(obj, typenum);
}

/* Bucket maps and positions: any integer dtype, as int64 (the values are
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

/*
 * The term modules' arrays of config (csrc/terms.h) into p's terms: each
 * (B|1, H|1, length) (the list's length, or any), leading axes of one may be
 * left out; a float array of the four dtypes, converted where it is not
 * float64 (or, for a `real` array, the problem's compute type: float64 for a
 * float64 problem, float32 for the others).  p's shape and dtype set.  0, or
 * -1 with an exception.
 */
static int build_terms(PyObject *config, converted *a, posenc_problem *p)
{
    int place[POSENC_TERM_COUNT] = {0};
    for (int t = 0; t < TERM_FIELD_COUNT; ++t) {
        const int field = term_fields[t].field, k = term_fields[t].kind;
        const int at = place[k]++;
        PyObject *obj = PyTuple_GET_ITEM(config, field);
        if (obj == Py_None)
            continue;
        const int type = term_fields[t].real;   /* terms.h: 0 float64, 1 real, 2 int64 */
        const int typenum = type == POSENC_TERM_REAL && p->dtype != POSENC_F64 ? NPY_FLOAT
                                                                              : NPY_DOUBLE;
        if (type == POSENC_TERM_INDEX) {
            if (!(a->arr[field] = as_index_array(obj, config_names[field])))
                return -1;
        } else if (!PyArray_Check(obj) || dtype_of(PyArray_TYPE((PyArrayObject *)obj)) < 0) {
            PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray of dtype " FLOAT_DTYPES_TEXT,
                         config_names[field]);
            return -1;
        } else if (!(a->arr[field] = as_c_array(obj, typenum))) {
            return -1;
        }
        const int ndim = PyArray_NDIM(a->arr[field]);
        const npy_intp length = (npy_intp)term_field_length(p, t);
        npy_intp shape[3] = {1, 1, 1};
        for (int x = 0; x < ndim && ndim <= 3; ++x)
            shape[3 - ndim + x] = PyArray_DIM(a->arr[field], x);
        const size_t batches = (size_t)shape[0], heads = (size_t)shape[1];
        const npy_intp per_unit = shape[2];
        if (ndim < 1 || ndim > 3 || (length && per_unit != length) ||
            (batches != p->B && batches != 1) || (heads != p->H && heads != 1)) {
            PyErr_Format(PyExc_ValueError,
                         "%s must be (B|1, H|1, L) with B = %zu, H = %zu, L = %zd (0: any), got "
                         "%d dimensions, the last three (%zu, %zu, %zd)", config_names[field],
                         p->B, p->H, (Py_ssize_t)length, ndim, batches, heads,
                         (Py_ssize_t)per_unit);
            return -1;
        }
        p->terms[k].array[at] = (posenc_term_array){
            PyArray_DATA(a->arr[field]), batches == 1 ? 0 : heads * (size_t)per_unit,
            heads == 1 ? 0 : (size_t)per_unit, (size_t)per_unit};
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
    PyObject *q = PyTuple_GET_ITEM(config, CF_q);
    if (!PyArray_Check(q)) {
        PyErr_SetString(PyExc_TypeError, "q must be a numpy.ndarray");
        return -1;
    }
    const int typenum = PyArray_TYPE((PyArrayObject *)q);
    const int dtype = dtype_of(typenum);
    if (dtype < 0) {
        PyErr_SetString(PyExc_TypeError, "q must have dtype " FLOAT_DTYPES_TEXT);
        return -1;
    }
    for (size_t t = 0; t < sizeof float_fields / sizeof float_fields[0]; ++t) {
        const int field = float_fields[t];
        PyObject *obj = PyTuple_GET_ITEM(config, field);
        posenc_strides *rows = field == CF_q ? &p->q_strides : field == CF_k ? &p->k_strides : NULL;
        if (obj != Py_None &&
            !(a->arr[field] = rows ? as_rows_array(obj, typenum, config_names[field], rows)
                                   : as_float_array(obj, typenum, config_names[field])))
            return -1;
    }
    for (size_t t = 0; t < sizeof index_fields / sizeof index_fields[0]; ++t) {
        const int field = index_fields[t];
        PyObject *obj = PyTuple_GET_ITEM(config, field);
        if (obj != Py_None && !(a->arr[field] = as_index_array(obj, config_names[field])))
            return -1;
    }
    const int product = PyObject_IsTrue(PyTuple_GET_ITEM(config, CF_product));
    const int interleaved = PyObject_IsTrue(PyTuple_GET_ITEM(config, CF_rope_interleaved));
    if (product < 0 || interleaved < 0 || read_double(config, CF_scale, &p->scale) ||
        read_double(config, CF_dense_scale, &p->dense_scale) ||
        read_double(config, CF_vector_scale, &p->vector_scale) ||
        read_size(config, CF_query_offset, &p->query_offset))
        return -1;
    if (!a->arr[CF_k]) {
        PyErr_SetString(PyExc_TypeError, "k is required");
        return -1;
    }

    const npy_intp any = -1;
    if (check_dims(a->arr[CF_q], "q", 4, (npy_intp[]){any, any, any, any}))
        return -1;
    const npy_intp B = PyArray_DIM(a->arr[CF_q], 0), H = PyArray_DIM(a->arr[CF_q], 1);
    const npy_intp n = PyArray_DIM(a->arr[CF_q], 2), d = PyArray_DIM(a->arr[CF_q], 3);
    if (check_dims(a->arr[CF_k], "k", 4, (npy_intp[]){B, any, any, d}))
        return -1;
    const npy_intp m = PyArray_DIM(a->arr[CF_k], 2), H_kv = PyArray_DIM(a->arr[CF_k], 1);
    if (H_kv != H && (H_kv == 0 || H % H_kv)) {   /* grouped-query attention: H_kv divides H */
        PyErr_Format(PyExc_ValueError, "k has %zd heads, which do not divide q's %zd",
                     (Py_ssize_t)H_kv, (Py_ssize_t)H);
        return -1;
    }
    if (a->arr[CF_rope_cos] || a->arr[CF_rope_sin]) {
        if (!a->arr[CF_rope_cos] || !a->arr[CF_rope_sin] ||
            !a->arr[CF_rope_cos_k] != !a->arr[CF_rope_sin_k]) {
            PyErr_SetString(PyExc_ValueError, "rope_cos and rope_sin come together, and "
                                              "rope_cos_k with rope_sin_k");
            return -1;
        }
        if (check_dims(a->arr[CF_rope_cos], "rope_cos", 2, (npy_intp[]){any, any}))
            return -1;
        const npy_intp P = PyArray_DIM(a->arr[CF_rope_cos], 0);
        const npy_intp pairs = PyArray_DIM(a->arr[CF_rope_cos], 1);
        const npy_intp table[2] = {P, pairs};
        if (check_dims(a->arr[CF_rope_sin], "rope_sin", 2, table) ||
            (a->arr[CF_rope_cos_k] && (check_dims(a->arr[CF_rope_cos_k], "rope_cos_k", 2, table) ||
                                       check_dims(a->arr[CF_rope_sin_k], "rope_sin_k", 2, table))))
            return -1;
        p->rope_cos = DATA(CF_rope_cos);
        p->rope_sin = DATA(CF_rope_sin);
        p->rope_cos_k = a->arr[CF_rope_cos_k] ? DATA(CF_rope_cos_k) : p->rope_cos;
        p->rope_sin_k = a->arr[CF_rope_sin_k] ? DATA(CF_rope_sin_k) : p->rope_sin;
        p->rope_positions = (size_t)P;
        p->rope_pairs = (size_t)pairs;
        p->rope_interleaved = interleaved;
    }
    if ((a->arr[CF_positions_q] && check_dims(a->arr[CF_positions_q], "positions_q", 2,
                                              (npy_intp[]){B, n})) ||
        (a->arr[CF_positions_k] && check_dims(a->arr[CF_positions_k], "positions_k", 2,
                                              (npy_intp[]){B, m})))
        return -1;
    if (a->arr[CF_positions_q])
        p->positions_q = (const int64_t *)DATA(CF_positions_q);
    if (a->arr[CF_positions_k])
        p->positions_k = (const int64_t *)DATA(CF_positions_k);
    p->dtype = (posenc_dtype)dtype;
    p->product = product;
    p->B = (size_t)B;
    p->H = (size_t)H;
    p->H_kv = (size_t)H_kv;
    p->n = (size_t)n;
    p->m = (size_t)m;
    p->d = (size_t)d;
    p->q = DATA(CF_q);
    p->k = DATA(CF_k);
    if (build_terms(config, a, p))
        return -1;
    const posenc_term_array *token = p->terms[POSENC_TERM_rope_token].array;
    if (token[0].data) {   /* per-token rotary tables (terms.h): their pairs per row */
        p->rope_pairs = p->n ? token[0].per_unit / p->n : p->m ? token[2].per_unit / p->m : 0;
        p->rope_interleaved = interleaved;
    }
    const char *why = NULL;
    if (posenc_validate(p, &why) != POSENC_OK) {
        PyErr_Format(PyExc_ValueError, "inconsistent problem: %s", why);
        return -1;
    }
    return 0;
}

#undef DATA
#undef DIM
