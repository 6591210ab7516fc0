/*
 * module_attention.h -- the binding of the fused attention (SPEC §6), a
 * part of module.c included after its helpers (build_problem,
 * as_float_array, check_dims, result_or_out, new_result, new_grads,
 * grads_tuple, raise_status): parse, convert, the one posenc_validate of
 * build_problem, release the GIL, call, wrap; one exit path.  posenc/_attention.py has
 * checked the arguments with the user-facing messages; these checks are
 * the safety net of direct calls.
 */

/* A call: its config's arrays and problem, the attention's arrays and arguments. */
typedef struct {
    converted a;
    posenc_problem p;
    posenc_attention att;
    int typenum;
    PyArrayObject *v, *mask, *d_out, *out, *lse, *d_lse, *document_q, *document_k, *sinks;
} attention_call;

static void attention_call_release(attention_call *call)
{
    PyArrayObject *arrays[] = {call->v, call->mask, call->d_out, call->out, call->lse,
                               call->d_lse, call->document_q, call->document_k, call->sinks};
    for (size_t t = 0; t < sizeof arrays / sizeof arrays[0]; ++t)
        Py_XDECREF(arrays[t]);
    release(&call->a);
}

/* A window side: None (no bound) or an int >= 0.  0, or -1 with an exception. */
static int window_side(PyObject *side, size_t *bound)
{
    if (side == Py_None) {
        *bound = POSENC_UNBOUNDED;
        return 0;
    }
    const unsigned long long value = PyLong_AsUnsignedLongLong(side);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "a window side must be None or an int >= 0, got %R", side);
        return -1;
    }
    *bound = value >= (unsigned long long)POSENC_UNBOUNDED ? POSENC_UNBOUNDED - 1 : (size_t)value;
    return 0;
}

/* The shapes of SPEC §7 from rest[0..4]: window (None or (left, right)),
 * document_q, document_k (int64 (B, n), (B, m), both or None), softcap
 * (float, 0 or None: none), sinks (float64 (H,) or None).  0, or -1 with an
 * exception. */
static int parse_shapes(attention_call *call, PyObject *const *rest)
{
    posenc_attention *att = &call->att;
    const posenc_problem *p = &call->p;
    if (rest[0] != Py_None) {
        if (!PyTuple_Check(rest[0]) || PyTuple_GET_SIZE(rest[0]) != 2) {
            PyErr_Format(PyExc_TypeError, "window must be None or (left, right), got %R", rest[0]);
            return -1;
        }
        att->window = 1;
        if (window_side(PyTuple_GET_ITEM(rest[0], 0), &att->window_left) ||
            window_side(PyTuple_GET_ITEM(rest[0], 1), &att->window_right))
            return -1;
    }
    if ((rest[1] == Py_None) != (rest[2] == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "document_q and document_k come together or not at all");
        return -1;
    }
    if (rest[1] != Py_None) {
        if (!(call->document_q = as_index_array(rest[1], "document_q")) ||
            check_dims(call->document_q, "document_q", 2, (npy_intp[]){(npy_intp)p->B, (npy_intp)p->n}) ||
            !(call->document_k = as_index_array(rest[2], "document_k")) ||
            check_dims(call->document_k, "document_k", 2, (npy_intp[]){(npy_intp)p->B, (npy_intp)p->m}))
            return -1;
        att->document_q = (const int64_t *)PyArray_DATA(call->document_q);
        att->document_k = (const int64_t *)PyArray_DATA(call->document_k);
    }
    if (rest[3] != Py_None) {
        att->softcap = PyFloat_AsDouble(rest[3]);
        if (att->softcap == -1.0 && PyErr_Occurred())
            return -1;
        if (!(att->softcap > 0.0) || isinf(att->softcap)) {
            PyErr_Format(PyExc_ValueError, "softcap must be a finite float > 0 or None, got %R", rest[3]);
            return -1;
        }
    }
    if (rest[4] != Py_None) {
        if (check_float_array(rest[4], NPY_DOUBLE, "sinks", "the engine") ||
            !(call->sinks = (PyArrayObject *)PyArray_FROM_OTF(rest[4], NPY_DOUBLE, NPY_ARRAY_IN_ARRAY)) ||
            check_dims(call->sinks, "sinks", 1, (npy_intp[]){(npy_intp)p->H}))
            return -1;
        att->sinks = (const double *)PyArray_DATA(call->sinks);
    }
    return 0;
}

/*
 * A call's arguments, read positionally: the config at args[config_at], v
 * at args[v_at], (key_padding_mask, causal, dropout_p, seed, window,
 * document_q, document_k, softcap, sinks) from args[rest_at] on.  0, or -1
 * with an exception.
 */
static int parse_attention(attention_call *call, PyObject *const *args, int config_at, int v_at,
                           int rest_at)
{
    PyObject *const *rest = args + rest_at;
    posenc_attention *att = &call->att;
    if (build_problem(args[config_at], &call->a, &call->p))
        return -1;
    const posenc_problem *p = &call->p;
    const npy_intp B = (npy_intp)p->B, H_kv = (npy_intp)p->H_kv, m = (npy_intp)p->m;
    call->typenum = typenum_of(p->dtype);
    memset(att, 0, sizeof *att);
    if (!(call->v = as_rows_array(args[v_at], call->typenum, "v", &att->v_strides)) ||
        check_dims(call->v, "v", 4, (npy_intp[]){B, H_kv, m, -1}))
        return -1;
    att->v = PyArray_DATA(call->v);
    att->dv = (size_t)PyArray_DIM(call->v, 3);
    PyObject *mask = rest[0];
    if (mask != Py_None) {
        if (!PyArray_Check(mask) || PyArray_TYPE((PyArrayObject *)mask) != NPY_BOOL) {
            PyErr_SetString(PyExc_TypeError, "key_padding_mask must be a bool numpy.ndarray or None");
            return -1;
        }
        call->mask = (PyArrayObject *)PyArray_FROM_OTF(mask, NPY_BOOL, NPY_ARRAY_IN_ARRAY);
        if (!call->mask || check_dims(call->mask, "key_padding_mask", 2, (npy_intp[]){B, m}))
            return -1;
        att->key_padding_mask = (const uint8_t *)PyArray_DATA(call->mask);
    }
    const int causal = PyObject_IsTrue(rest[1]);
    if (causal < 0)
        return -1;
    att->causal = causal;
    att->dropout_p = PyFloat_AsDouble(rest[2]);
    if (att->dropout_p == -1.0 && PyErr_Occurred())
        return -1;
    if (!(att->dropout_p >= 0.0 && att->dropout_p < 1.0)) {
        PyErr_Format(PyExc_ValueError, "dropout_p must be in [0, 1), got %R", rest[2]);
        return -1;
    }
    att->seed = PyLong_AsUnsignedLongLong(rest[3]);
    if (att->seed == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "seed must be an int in [0, 2**64), got %R", rest[3]);
        return -1;
    }
    return parse_shapes(call, rest + 4);
}

/* The engine on a parsed call, the GIL released: the forward into call->out
 * and call->lse, or (g != NULL) the backward into g and grad_v.  0, or -1
 * with an exception. */
static int run_attention(const attention_call *call, const posenc_grads *g, void *grad_v)
{
    int status;
    const int threads = num_threads;
    void *out = PyArray_DATA(call->out), *lse = PyArray_DATA(call->lse);
    const void *d_out = g ? PyArray_DATA(call->d_out) : NULL;
    Py_BEGIN_ALLOW_THREADS
    if (g)
        status = posenc_attention_backward(&call->p, &call->att, d_out, out, lse, g, grad_v, threads);
    else
        status = posenc_attention_forward(&call->p, &call->att, out, lse, threads);
    Py_END_ALLOW_THREADS
    return raise_status(status);
}

/* attention_forward(config, v, key_padding_mask, causal, dropout_p, seed, window, document_q,
 * document_k, softcap, sinks, out) -> (out, lse). */
static PyObject *py_attention_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    attention_call call = {{{NULL}}};
    PyObject *result = NULL;
    if (check_arity(nargs, 12, "attention_forward(config, v, key_padding_mask, causal, dropout_p, "
                               "seed, window, document_q, document_k, softcap, sinks, out)") ||
        parse_attention(&call, args, 0, 1, 2))
        goto done;
    const posenc_problem *p = &call.p;
    const npy_intp dims[4] = {(npy_intp)p->B, (npy_intp)p->H, (npy_intp)p->n, (npy_intp)call.att.dv};
    if ((call.out = result_or_out(args[11], 4, dims, call.typenum, "(B, H, n, dv)")) &&
        (call.lse = new_result(3, dims, lse_typenum(p->dtype))) &&
        !run_attention(&call, NULL, NULL))
        result = PyTuple_Pack(2, (PyObject *)call.out, (PyObject *)call.lse);
done:
    attention_call_release(&call);
    return result;
}

/*
 * attention_backward(d_out, config, v, out, lse, key_padding_mask, causal,
 * dropout_p, seed, window, document_q, document_k, softcap, sinks, needs,
 * d_lse) -> the gradients of backward (ENGINE_GRADS order, the same rules), then dv
 * (bit GR_COUNT of needs), then dsinks (float64 (H,), bit GR_COUNT + 1, with
 * sinks); d_lse: dL/dlse (B, H, n) of lse's dtype, or None (lse unused).
 */
static PyObject *py_attention_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    attention_call call = {{{NULL}}};
    PyArrayObject *grads[GR_COUNT + 2] = {NULL};
    PyObject *result = NULL;
    if (check_arity(nargs, 16, "attention_backward(d_out, config, v, out, lse, key_padding_mask, "
                               "causal, dropout_p, seed, window, document_q, document_k, softcap, "
                               "sinks, needs, d_lse)") ||
        parse_attention(&call, args, 1, 2, 5))
        goto done;
    const unsigned long needs = PyLong_AsUnsignedLongMask(args[14]);
    if (needs == (unsigned long)-1 && PyErr_Occurred())
        goto done;
    const posenc_problem *p = &call.p;
    const int typenum = call.typenum;
    const npy_intp dims[4] = {(npy_intp)p->B, (npy_intp)p->H, (npy_intp)p->n, (npy_intp)call.att.dv};
    if (!(call.d_out = as_rows_array(args[0], typenum, "d_out", &call.att.d_out_strides)) ||
        check_dims(call.d_out, "d_out", 4, dims) ||
        !(call.out = as_float_array(args[3], typenum, "out")) || check_dims(call.out, "out", 4, dims) ||
        !(call.lse = as_float_array(args[4], lse_typenum(p->dtype), "lse")) ||
        check_dims(call.lse, "lse", 3, dims))
        goto done;
    if (args[15] != Py_None) {
        if (!(call.d_lse = as_float_array(args[15], lse_typenum(p->dtype), "d_lse")) ||
            check_dims(call.d_lse, "d_lse", 3, dims))
            goto done;
        call.att.d_lse = PyArray_DATA(call.d_lse);
    }
    posenc_grads g;
    if (new_grads(args[1], &call.a, (unsigned int)(needs & ((1u << GR_COUNT) - 1)), typenum,
                  grads, &g))
        goto done;
    if ((needs >> GR_COUNT & 1) && !(grads[GR_COUNT] = new_result(4, PyArray_DIMS(call.v), typenum)))
        goto done;
    if (call.sinks && (needs >> (GR_COUNT + 1) & 1)) {
        if (!(grads[GR_COUNT + 1] = new_result(1, PyArray_DIMS(call.sinks), NPY_DOUBLE)))
            goto done;
        call.att.grad_sinks = (double *)PyArray_DATA(grads[GR_COUNT + 1]);
    }
    if (!run_attention(&call, &g, grads[GR_COUNT] ? PyArray_DATA(grads[GR_COUNT]) : NULL))
        result = grads_tuple(grads, GR_COUNT + 2);
done:
    for (int t = 0; t < GR_COUNT + 2; ++t)
        Py_XDECREF(grads[t]);
    attention_call_release(&call);
    return result;
}
