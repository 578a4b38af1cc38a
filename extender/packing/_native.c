/* The decision core's per-node arithmetic in C, for the compiled build (MPSCHED_COMPILE=1).

Owns `Plan`: one node type's compiled fragmentation measure (policies/frag.py) and the FGD
score on it (policies/fgd.py), computed without allocating a Python object per step; and
`fit_share`: which GPUs of a node take a share by every budget (fit.py, ledger.share_cause),
read from a node's packed fit record instead of the ledger's objects. The rules
are the Python modules'; this file repeats their arithmetic operation for operation, in the
same order on the same operands, so that every result is the same double, bit for bit
(tests/packing/test_native.py holds it to the Python code and to the published reference).
Compiled without floating-point contraction (setup.py): a fused multiply-add rounds once
where Python rounds twice.

Why C. A /filter computes fit and score for every candidate node whose state its caches have
not seen: tens per pod in a cluster that keeps filling. Compiled with mypyc, one score still
cost far more, nearly all of it boxing, tuples and memo dictionaries; here it is a loop over a
few dozen task types on the stack. Pure: no I/O, no state besides the plan itself.

One translation unit in four files: the measure (_native_frag.h), the Plan type on it
(_native_plan.h), the share fit (_native_fit.h), and here the scaling of scores and the
module itself. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#include "_native_frag.h"
#include "_native_plan.h"
#include "_native_fit.h"

/* scale(raw, top) -> tuple[int, ...] | None: service.core._scale, min-max scaling of raw
   scores (a list or tuple) to 0..top, each int((s - lo) / span * top + 0.5) as Python computes
   it: the same doubles in the same order, and int()'s truncation of a non-negative operand.
   None where Python must decide: an item that is not exactly a float, or scores that are not
   finite or lie further apart than the largest double (Python's min and max, or its int(),
   behave otherwise there). */
static PyObject *
scale(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !(PyTuple_CheckExact(args[0]) || PyList_CheckExact(args[0])) ||
        !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "scale(raw: tuple | list of float, top: int)");
        return NULL;
    }
    long top = PyLong_AsLong(args[1]);
    if (top == -1 && PyErr_Occurred())
        return NULL;
    if (top < 0 || top > 1000) {
        PyErr_SetString(PyExc_ValueError, "scale: top must lie in 0..1000");
        return NULL;
    }
    /* The items are read without calling back into Python: the sequence cannot change. */
    PyObject *const *items = PySequence_Fast_ITEMS(args[0]);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(args[0]);
    double lo = 0.0, hi = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyFloat_CheckExact(items[i]))
            return Py_NewRef(Py_None);
        double v = PyFloat_AS_DOUBLE(items[i]);
        if (!isfinite(v))
            return Py_NewRef(Py_None);
        if (i == 0 || v < lo)
            lo = v;
        if (i == 0 || v > hi)
            hi = v;
    }
    double span = hi - lo;
    if (!isfinite(span))
        return Py_NewRef(Py_None);
    PyObject *out = PyTuple_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = top;
        if (span > 0)
            v = (long)((PyFloat_AS_DOUBLE(items[i]) - lo) / span * (double)top + 0.5);
        PyObject *o = PyLong_FromLong(v);
        if (o == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, o);
    }
    return out;
}

static PyMethodDef module_methods[] = {
    {"fit_share", (PyCFunction)(void (*)(void))fit_share, METH_FASTCALL,
     "fit_share(record, demands, run_as_user, uid_isolation) -> (gpus, shapes) | None."},
    {"fill_share", (PyCFunction)(void (*)(void))fill_share, METH_FASTCALL,
     "fill_share(record, demands, run_as_user, uid_isolation, plan, cpu_free, free, pod_cpu)"
     " -> (score, gpu) | None."},
    {"pick_bytes", (PyCFunction)(void (*)(void))pick_bytes, METH_FASTCALL,
     "pick_bytes(source, ids) -> bytes: source[i] for each id."},
    {"pick_doubles", (PyCFunction)(void (*)(void))pick_doubles, METH_FASTCALL,
     "pick_doubles(source, ids) -> tuple[float, ...]: source[i] for each id."},
    {"scale", (PyCFunction)(void (*)(void))scale, METH_FASTCALL,
     "scale(raw, top) -> tuple[int, ...] | None: min-max scaling to 0..top."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "extender.packing._native",
    .m_doc = "The decision core's per-node arithmetic in C (see the source's opening comment).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&PlanType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "MAX_GPUS", MAX_GPUS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *fields = PyTuple_New(FIT_WORDS);
    for (Py_ssize_t i = 0; fields != NULL && i < FIT_WORDS; i++) {
        PyObject *name = PyUnicode_FromString(record_fields[i]);
        if (name == NULL)
            Py_CLEAR(fields);
        else
            PyTuple_SET_ITEM(fields, i, name);
    }
    if (fields == NULL || PyModule_AddObject(m, "RECORD_FIELDS", fields) < 0) {
        Py_XDECREF(fields);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
