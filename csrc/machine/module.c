/*
 * module.c -- posenc._machine, the binding of the measuring loops (the
 * benchmarks state their timings as a fraction of these limits).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "machine.h"

#include <string.h>

static int dtype_from_name(const char *name)
{
    if (strcmp(name, "float32") == 0) return POSENC_F32;
    if (strcmp(name, "float64") == 0) return POSENC_F64;
    if (strcmp(name, "bfloat16") == 0) return POSENC_BF16;   /* avx512 with AVX512-BF16 only */
    return -1;
}

/* The ISA named `name` when this module can measure it, else -1 with a ValueError. */
static int measurable_isa(const char *name, const char *what)
{
    const int isa = posenc_isa_from_name(name);
    if (isa < 0 || !posenc_machine_loops_for((posenc_isa)isa, POSENC_F32)) {
        PyErr_Format(PyExc_ValueError, "%s: %s ISA %s", what, isa < 0 ? "unknown" : "unsupported",
                     name);
        return -1;
    }
    return isa;
}

static PyObject *py_measure_fma(PyObject *self, PyObject *args)
{
    const char *isa_name, *dtype_name;
    int threads;
    double seconds;
    (void)self;
    if (!PyArg_ParseTuple(args, "ssid", &isa_name, &dtype_name, &threads, &seconds))
        return NULL;
    const int isa = measurable_isa(isa_name, "measure_fma"), dtype = dtype_from_name(dtype_name);
    if (isa < 0)
        return NULL;
    if (dtype < 0 || threads < 1) {
        PyErr_Format(PyExc_ValueError, "measure_fma: unsupported dtype %s / threads %d", dtype_name,
                     threads);
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
    const int isa = measurable_isa(isa_name, "measure_store");
    if (isa < 0)
        return NULL;
    if (bytes <= 0 || threads < 1 || repeats < 1) {
        PyErr_SetString(PyExc_ValueError, "measure_store: bytes, threads and repeats must be positive");
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

static PyObject *py_capabilities(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *list = PyList_New(0);
    for (int isa = 0; list && isa < POSENC_ISA_COUNT; ++isa) {
        if (!posenc_machine_loops_for((posenc_isa)isa, POSENC_F32))
            continue;
        PyObject *name = PyUnicode_FromString(posenc_isa_name((posenc_isa)isa));
        if (!name || PyList_Append(list, name))
            Py_CLEAR(list);
        Py_XDECREF(name);
    }
    return list;
}

static PyMethodDef methods[] = {
    {"measure_fma", py_measure_fma, METH_VARARGS,
     "measure_fma(isa, dtype, threads, seconds) -> FLOP/s of the ISA's FMA loop."},
    {"measure_store", py_measure_store, METH_VARARGS,
     "measure_store(isa, bytes, threads, nontemporal, repeats) -> bytes/s of storing a buffer."},
    {"capabilities", py_capabilities, METH_NOARGS,
     "ISAs this CPU and OS support and this module compiled: those it can measure."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "posenc._machine",
    .m_doc = "The machine's limits, measured (benchmarks only).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__machine(void)
{
    return PyModule_Create(&module);
}
