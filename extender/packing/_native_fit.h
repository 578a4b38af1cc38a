/* The share fit in C: which GPUs of a node take a share by every budget, read from the node's
   packed fit record (ledger.share_cause is the rule), and the fit with its score in one call;
   the result arrays' pickers. Included once, by _native.c, after _native_plan.h. */

/* A node's fit record (state_index.py's `fit_record`), int64 words: a header (GPU count, the
   node runs multi-user MPS), then per GPU, in the node's order, the FIT_WORDS below: the
   fields of state_index.GpuFigures, in its order. The module lists their names
   (RECORD_FIELDS, from record_fields[]), and state_index refuses at import an extension whose
   list is not its own. The fit reads the first twelve. */
#define FIT_HEADER 2
enum {
    F_INDEX, F_SHAPE, F_CAP_THREADS, F_CAP_MEMORY, F_CAP_CLIENTS, F_CAP_OVERHEAD,
    F_THREADS, F_MEMORY, F_CLIENTS, F_OWNED, F_UID_KIND, F_UID, F_IDLE, F_UNSHAREABLE,
    FIT_WORDS
};
static const char *const record_fields[] = {
    [F_INDEX] = "gpu_index", [F_SHAPE] = "shape", [F_CAP_THREADS] = "cap_threads",
    [F_CAP_MEMORY] = "cap_memory", [F_CAP_CLIENTS] = "cap_clients",
    [F_CAP_OVERHEAD] = "cap_overhead", [F_THREADS] = "threads", [F_MEMORY] = "memory",
    [F_CLIENTS] = "clients", [F_OWNED] = "owned", [F_UID_KIND] = "uid_kind", [F_UID] = "uid",
    [F_IDLE] = "idle", [F_UNSHAREABLE] = "unshareable",
};
_Static_assert(sizeof(record_fields) / sizeof(record_fields[0]) == FIT_WORDS,
               "a name for every record field");
/* F_UID_KIND: no share runs here; one share runs here, its UID not known (None); all run as
   F_UID; more than one UID, or more than one share of unknown UID, runs here (over budget
   under UID isolation). */
enum { UIDS_NONE = 0, UIDS_UNSET = 1, UIDS_ONE = 2, UIDS_MANY = 3 };
#define DEMAND_WORDS 3

/* The fit's inputs, read from Python objects: a node's record, a request's demands per GPU
   shape, its UID and whether UIDs are isolated. */
typedef struct {
    Py_buffer record, demands;
    int have_record, have_demands;
    int uid_unset, isolated;
    long long uid;
} FitInput;

static void
fit_input_release(FitInput *in)
{
    if (in->have_record)
        PyBuffer_Release(&in->record);
    if (in->have_demands)
        PyBuffer_Release(&in->demands);
}

static int
fit_input_read(FitInput *in, PyObject *record, PyObject *demands, PyObject *run_as_user,
               PyObject *uid_isolation)
{
    memset(in, 0, sizeof(*in));
    if (PyObject_GetBuffer(record, &in->record, PyBUF_SIMPLE) < 0)
        return -1;
    in->have_record = 1;
    if (PyObject_GetBuffer(demands, &in->demands, PyBUF_SIMPLE) < 0)
        return -1;
    in->have_demands = 1;
    in->isolated = PyObject_IsTrue(uid_isolation);
    in->uid_unset = run_as_user == Py_None;
    if (in->isolated < 0 || (!in->uid_unset && as_ll(run_as_user, &in->uid) < 0))
        return -1;
    return 0;
}

/* The GPUs of the record whose every budget takes the share (ledger.share_cause, in its
   order; only whether a cause exists matters here): their indexes and GPU shapes into
   index[] and shape[], their count returned; -1 with an exception for a malformed input. */
static Py_ssize_t
fit_candidates(const FitInput *in, long long *index, long long *shape)
{
    const long long *r = in->record.buf;
    const long long *d = in->demands.buf;
    Py_ssize_t words = in->record.len / (Py_ssize_t)sizeof(long long);
    Py_ssize_t shapes = in->demands.len / (Py_ssize_t)(DEMAND_WORDS * sizeof(long long));
    if (words < FIT_HEADER || r[0] < 0 || r[0] > MAX_GPUS ||
        words != FIT_HEADER + r[0] * FIT_WORDS) {
        PyErr_SetString(PyExc_ValueError, "not a fit record");
        return -1;
    }
    Py_ssize_t n = (Py_ssize_t)r[0];
    int uid_rule = in->isolated && r[1] == 0; /* not a multi-user node */
    Py_ssize_t found = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const long long *g = r + FIT_HEADER + i * FIT_WORDS;
        long long s = g[F_SHAPE];
        if (s < 0 || s >= shapes) {
            PyErr_Format(PyExc_ValueError, "no demand for GPU shape %lld", s);
            return -1;
        }
        long long threads = d[s * DEMAND_WORDS], memory = d[s * DEMAND_WORDS + 1],
                  clients = d[s * DEMAND_WORDS + 2];
        if (g[F_CAP_THREADS] == 0 || g[F_OWNED])
            continue;
        if (uid_rule && g[F_UID_KIND] == UIDS_MANY)
            continue;
        if (g[F_THREADS] + threads > g[F_CAP_THREADS])
            continue;
        if (g[F_CLIENTS] + clients > g[F_CAP_CLIENTS])
            continue;
        /* GpuCapacity.memory_left(used, clients + asked) < asked memory */
        if (g[F_CAP_MEMORY] - g[F_MEMORY] - (g[F_CLIENTS] + clients) * g[F_CAP_OVERHEAD] < memory)
            continue;
        /* A UID not known (UIDS_UNSET here, or the pod's) is never taken to be another's:
           such a share only goes to a GPU without shares, and takes none after it. */
        if (uid_rule && g[F_UID_KIND] != UIDS_NONE &&
            !(g[F_UID_KIND] == UIDS_ONE && !in->uid_unset && in->uid == g[F_UID]))
            continue;
        index[found] = g[F_INDEX];
        shape[found] = s;
        found++;
    }
    return found;
}

/* fit_share(record, demands, run_as_user, uid_isolation) -> (gpus, shapes) | None: the
   indexes of the GPUs whose every budget takes the share, and the GPU shape of each (an index
   into `demands`: int64 triples threads, memory MiB, clients per GPU shape); None when no GPU
   does (the caller's Python fit then says why). */
static PyObject *
fit_share(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "fit_share(record, demands, run_as_user, uid_isolation)");
        return NULL;
    }
    FitInput in;
    long long index[MAX_GPUS], shape[MAX_GPUS];
    PyObject *result = NULL;
    Py_ssize_t found = -1;
    if (fit_input_read(&in, args[0], args[1], args[2], args[3]) == 0)
        found = fit_candidates(&in, index, shape);
    fit_input_release(&in);
    if (found < 0)
        return NULL;
    if (found == 0)
        return Py_NewRef(Py_None);
    PyObject *gpus = PyTuple_New(found), *kinds = PyTuple_New(found);
    if (gpus == NULL || kinds == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < found; i++) {
        PyObject *a = PyLong_FromLongLong(index[i]), *b = PyLong_FromLongLong(shape[i]);
        if (a == NULL || b == NULL) {
            Py_XDECREF(a);
            Py_XDECREF(b);
            goto done;
        }
        PyTuple_SET_ITEM(gpus, i, a);
        PyTuple_SET_ITEM(kinds, i, b);
    }
    result = PyTuple_Pack(2, gpus, kinds);
done:
    Py_XDECREF(gpus);
    Py_XDECREF(kinds);
    return result;
}

/* fill_share(record, demands, run_as_user, uid_isolation, plan, cpu_free, free, pod_cpu)
   -> (score, gpu) | None: a share's fit and FGD score on one node state at once, as the
   evaluator's fill makes them (fit_node, pod_shape with the first candidate's threads,
   FgdPolicy.score, share_gpu), without a Fit or a PodShape; None when no GPU takes it. */
static PyObject *
fill_share(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyObject_TypeCheck(args[4], &PlanType)) {
        PyErr_SetString(PyExc_TypeError, "fill_share(record, demands, run_as_user, "
                                         "uid_isolation, plan, cpu_free, free, pod_cpu)");
        return NULL;
    }
    FitInput in;
    long long index[MAX_GPUS], shape[MAX_GPUS], free[MAX_GPUS];
    Py_ssize_t found = -1;
    if (fit_input_read(&in, args[0], args[1], args[2], args[3]) == 0)
        found = fit_candidates(&in, index, shape);
    long long threads = found > 0 ? ((const long long *)in.demands.buf)[shape[0] * DEMAND_WORDS]
                                  : 0;
    fit_input_release(&in);
    if (found < 0)
        return NULL;
    if (found == 0)
        return Py_NewRef(Py_None);
    long long cpu_free, pod_cpu;
    if (as_ll(args[5], &cpu_free) < 0 || as_ll(args[7], &pod_cpu) < 0)
        return NULL;
    Py_ssize_t n = read_amounts(args[6], free, "free");
    if (n < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < found; i++) {
        if (index[i] < 0 || index[i] >= n) {
            PyErr_SetString(PyExc_IndexError, "a GPU index past the node's free amounts");
            return NULL;
        }
    }
    /* view.pod_shape: a share's thread percent kept within 1..WHOLE, on one GPU. */
    threads = threads < 1 ? 1 : (threads > WHOLE ? WHOLE : threads);
    long best;
    Py_ssize_t chosen;
    if (fgd_policy_score((PlanObject *)args[4], cpu_free, free, n, pod_cpu, threads, 1, index,
                         found, &best, &chosen) < 0)
        return NULL;
    /* view.share_gpu: the policy's choice, else the tightest candidate, lowest index on ties */
    Py_ssize_t gpu = -1;
    for (Py_ssize_t i = 0; i < found; i++) {
        if (index[i] == chosen)
            gpu = chosen;
    }
    if (gpu < 0) {
        gpu = (Py_ssize_t)index[0];
        for (Py_ssize_t i = 0; i < found; i++) {
            long long g = index[i];
            if (free[g] < free[gpu] || (free[g] == free[gpu] && g < gpu))
                gpu = (Py_ssize_t)g;
        }
    }
    return Py_BuildValue("(dn)", (double)best, gpu);
}

/* The ids of a gather: a tuple of non-negative ints, each below `size`; -1 with IndexError or
   TypeError otherwise. */
static int
gather_index(PyObject *ids, Py_ssize_t i, Py_ssize_t size, Py_ssize_t *out)
{
    Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(ids, i));
    if (at == -1 && PyErr_Occurred())
        return -1;
    if (at < 0 || at >= size) {
        PyErr_SetString(PyExc_IndexError, "gather: an id outside the source");
        return -1;
    }
    *out = at;
    return 0;
}

/* pick_bytes(source, ids) -> bytes: source[i] for each i of ids, from a buffer of bytes (the
   evaluator's status bytes by state id). `bytes(itemgetter(*ids)(source))` without the tuple of
   ints in between. */
static PyObject *
pick_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pick_bytes(source, ids: tuple[int, ...])");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(args[1]);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out != NULL) {
        char *w = PyBytes_AS_STRING(out);
        const char *src = view.buf;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t at;
            if (gather_index(args[1], i, view.len, &at) < 0) {
                Py_CLEAR(out);
                break;
            }
            w[i] = src[at];
        }
    }
    PyBuffer_Release(&view);
    return out;
}

/* pick_doubles(source, ids) -> tuple[float, ...]: source[i] for each i of ids, from an
   array('d') (the evaluator's scores by state id): itemgetter's tuple without a subscript call
   per item. */
static PyObject *
pick_doubles(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "pick_doubles(source, ids: tuple[int, ...])");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_FORMAT) < 0)
        return NULL;
    PyObject *out = NULL;
    if (view.itemsize != (Py_ssize_t)sizeof(double) || view.format == NULL ||
        strcmp(view.format, "d") != 0) {
        PyErr_SetString(PyExc_TypeError, "pick_doubles: the source must be an array('d')");
        goto done;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(args[1]), size = view.len / (Py_ssize_t)sizeof(double);
    const double *src = view.buf;
    out = PyTuple_New(n);
    if (out == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t at;
        PyObject *value = NULL;
        if (gather_index(args[1], i, size, &at) == 0)
            value = PyFloat_FromDouble(src[at]);
        if (value == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, value);
    }
done:
    PyBuffer_Release(&view);
    return out;
}
