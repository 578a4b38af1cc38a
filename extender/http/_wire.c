/* The hot answer of the wire in C, for the compiled build (MPSCHED_COMPILE=1).

Owns `host_priorities`: prioritize's HostPriorityList written as JSON bytes, byte for byte the
output of wire.host_priorities (tests/http/test_wire_native.py holds the two to each other).
A prioritize call at hundreds of nodes spent most of its CPU there in Python (orjson for the
names, then a split and a join to splice the scores in); here it is one pass that sizes the answer
and one that writes it. It writes only what needs no JSON escaping: hosts of printable ASCII
without `"` or `\`, as Kubernetes node names always are, and scores 0..99. For anything else
it answers None and the Python code writes the answer. Pure: no I/O, no state. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static const char HOST[] = "{\"Host\":\"";
static const char SCORE[] = "\",\"Score\":";
#define HOST_LEN (sizeof(HOST) - 1)
#define SCORE_LEN (sizeof(SCORE) - 1)

/* The host's characters when JSON takes them as they are, else NULL (no exception). */
static const char *
plain_ascii(PyObject *host, Py_ssize_t *len)
{
    if (!PyUnicode_CheckExact(host) || !PyUnicode_IS_ASCII(host))
        return NULL;
    const char *text = (const char *)PyUnicode_1BYTE_DATA(host);
    Py_ssize_t n = PyUnicode_GET_LENGTH(host);
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = text[i];
        if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
            return NULL;
    }
    *len = n;
    return text;
}

/* host_priorities(hosts, scores) -> bytes | None: `[{"Host":"a","Score":7},...]` for a list
   of hosts and a tuple of int scores of the same length (TypeError or ValueError otherwise);
   None when a host or a score is one this writer leaves to Python (see above). */
static PyObject *
host_priorities(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "host_priorities(hosts: list[str], scores: tuple)");
        return NULL;
    }
    PyObject *hosts = args[0], *scores = args[1];
    Py_ssize_t n = PyList_GET_SIZE(hosts);
    if (PyTuple_GET_SIZE(scores) != n) {
        PyErr_Format(PyExc_ValueError, "%zd hosts but %zd scores", n, PyTuple_GET_SIZE(scores));
        return NULL;
    }
    /* `[`, `]`, and per host its text, the two fixed parts, `}` and a comma (one too many) */
    Py_ssize_t size = 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        if (plain_ascii(PyList_GET_ITEM(hosts, i), &len) == NULL)
            return Py_NewRef(Py_None);
        PyObject *score = PyTuple_GET_ITEM(scores, i);
        if (!PyLong_CheckExact(score))
            return Py_NewRef(Py_None);
        long s = PyLong_AsLong(score);
        if (s < 0 || s > 99) {
            PyErr_Clear();
            return Py_NewRef(Py_None);
        }
        size += (Py_ssize_t)(HOST_LEN + SCORE_LEN) + len + (s > 9 ? 2 : 1) + 2;
    }
    if (n > 0)
        size -= 1;
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    char *w = PyBytes_AS_STRING(out);
    *w++ = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len = 0;
        /* The list cannot change meanwhile: nothing here calls back into Python. */
        const char *text = plain_ascii(PyList_GET_ITEM(hosts, i), &len);
        long s = PyLong_AsLong(PyTuple_GET_ITEM(scores, i));
        if (i > 0)
            *w++ = ',';
        memcpy(w, HOST, HOST_LEN);
        w += HOST_LEN;
        memcpy(w, text, (size_t)len);
        w += len;
        memcpy(w, SCORE, SCORE_LEN);
        w += SCORE_LEN;
        if (s > 9)
            *w++ = (char)('0' + s / 10);
        *w++ = (char)('0' + s % 10);
        *w++ = '}';
    }
    *w++ = ']';
    if (w - PyBytes_AS_STRING(out) != size) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_SystemError, "host_priorities: size mismatch");
        return NULL;
    }
    return out;
}

static PyMethodDef module_methods[] = {
    {"host_priorities", (PyCFunction)(void (*)(void))host_priorities, METH_FASTCALL,
     "host_priorities(hosts, scores) -> bytes | None: prioritize's HostPriorityList."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef wire_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "extender.http._wire",
    .m_doc = "Prioritize's answer written in C (see the source's opening comment).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__wire(void)
{
    return PyModule_Create(&wire_module);
}
