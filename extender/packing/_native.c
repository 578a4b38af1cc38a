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
few dozen task types on the stack. Pure: no I/O, no state besides the plan itself. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#define WHOLE 100
#define LEFT_LEN (WHOLE + 1)
/* Free amounts of one node, at most (a node with more GPUs takes the Python path). */
#define MAX_GPUS 64
/* fgd.py's DELTA_SCALE and EXP_LIMIT. */
#define DELTA_SCALE 100.0
#define EXP_LIMIT 50.0

typedef struct {
    long long cpu;  /* millicores of one pod of the type */
    long long gpus; /* GPUs of one pod */
    int allowed;    /* the plan's GPU model is one the type may use */
    double p;       /* weight on this node type */
    long long ask;  /* GPU of one pod: size x GPU count */
} Task;

typedef struct {
    long long need;  /* per-GPU size of the group's types */
    Py_ssize_t first; /* tasks[first : first + count] */
    Py_ssize_t count;
    double rest;     /* weight of this size and every larger one */
} Group;

typedef struct {
    PyObject_HEAD
    double cpu_only;
    double w;
    int mix;
    Py_ssize_t ngroups;
    Group *groups;
    Task *tasks;
    double left[LEFT_LEN];
    double gaps[LEFT_LEN];
} PlanObject;

/* A Python int that must fit a C long long; -1 with an exception set otherwise. */
static int
as_ll(PyObject *o, long long *out)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = v;
    return 0;
}

static void
Plan_dealloc(PlanObject *self)
{
    PyMem_Free(self->groups);
    PyMem_Free(self->tasks);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Plan(cpu_only, groups, left, gaps, lookahead, mix): groups as frag.py compiles them, each
   task (cpu, gpus, allowed, popularity, ask) with `allowed` already decided for the plan's
   model; left and gaps of length WHOLE + 1 (or empty without the mix look-ahead). */
static int
Plan_init(PlanObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"cpu_only", "groups", "left", "gaps", "lookahead", "mix", NULL};
    double cpu_only, w;
    int mix;
    PyObject *groups, *left, *gaps;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "dO!O!O!dp", kwlist, &cpu_only, &PyTuple_Type,
                                     &groups, &PyTuple_Type, &left, &PyTuple_Type, &gaps, &w,
                                     &mix))
        return -1;
    if (self->groups != NULL) {
        PyErr_SetString(PyExc_TypeError, "Plan is immutable: it was initialised already");
        return -1;
    }
    Py_ssize_t nleft = PyTuple_GET_SIZE(left);
    if ((nleft != 0 && nleft != LEFT_LEN) || PyTuple_GET_SIZE(gaps) != nleft) {
        PyErr_Format(PyExc_ValueError, "left and gaps must both have %d items or none",
                     LEFT_LEN);
        return -1;
    }
    if (mix && nleft == 0 && w > 0.0) {
        PyErr_SetString(PyExc_ValueError, "the mix look-ahead needs its left and gaps tables");
        return -1;
    }
    for (Py_ssize_t i = 0; i < LEFT_LEN; i++) {
        self->left[i] = 0.0;
        self->gaps[i] = 0.0;
    }
    for (Py_ssize_t i = 0; i < nleft; i++) {
        self->left[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(left, i));
        self->gaps[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(gaps, i));
        if (PyErr_Occurred())
            return -1;
    }
    Py_ssize_t ngroups = PyTuple_GET_SIZE(groups);
    Py_ssize_t ntasks = 0;
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        PyObject *group = PyTuple_GET_ITEM(groups, g);
        if (!PyTuple_Check(group) || PyTuple_GET_SIZE(group) != 3 ||
            !PyTuple_Check(PyTuple_GET_ITEM(group, 1))) {
            PyErr_SetString(PyExc_TypeError, "a group is (need, tasks, rest)");
            return -1;
        }
        ntasks += PyTuple_GET_SIZE(PyTuple_GET_ITEM(group, 1));
    }
    self->groups = PyMem_Calloc(ngroups ? ngroups : 1, sizeof(Group));
    self->tasks = PyMem_Calloc(ntasks ? ntasks : 1, sizeof(Task));
    if (self->groups == NULL || self->tasks == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t t = 0;
    for (Py_ssize_t g = 0; g < ngroups; g++) {
        PyObject *group = PyTuple_GET_ITEM(groups, g);
        PyObject *tasks = PyTuple_GET_ITEM(group, 1);
        Group *out = &self->groups[g];
        if (as_ll(PyTuple_GET_ITEM(group, 0), &out->need) < 0)
            return -1;
        if (out->need < 1 || out->need > WHOLE) {
            PyErr_Format(PyExc_ValueError, "a group's size must be 1..%d, got %lld", WHOLE,
                         out->need);
            return -1;
        }
        out->rest = PyFloat_AsDouble(PyTuple_GET_ITEM(group, 2));
        if (PyErr_Occurred())
            return -1;
        out->first = t;
        out->count = PyTuple_GET_SIZE(tasks);
        for (Py_ssize_t i = 0; i < out->count; i++, t++) {
            PyObject *task = PyTuple_GET_ITEM(tasks, i);
            Task *d = &self->tasks[t];
            if (!PyTuple_Check(task) || PyTuple_GET_SIZE(task) != 5) {
                PyErr_SetString(PyExc_TypeError, "a task is (cpu, gpus, allowed, p, ask)");
                return -1;
            }
            if (as_ll(PyTuple_GET_ITEM(task, 0), &d->cpu) < 0 ||
                as_ll(PyTuple_GET_ITEM(task, 1), &d->gpus) < 0 ||
                as_ll(PyTuple_GET_ITEM(task, 4), &d->ask) < 0)
                return -1;
            d->allowed = PyObject_IsTrue(PyTuple_GET_ITEM(task, 2));
            d->p = PyFloat_AsDouble(PyTuple_GET_ITEM(task, 3));
            if (d->allowed < 0 || PyErr_Occurred())
                return -1;
            if (d->gpus < 1 || d->cpu < 0) {
                PyErr_SetString(PyExc_ValueError, "a task asks at least one GPU and no negative CPU");
                return -1;
            }
        }
    }
    self->ngroups = ngroups;
    self->cpu_only = cpu_only;
    self->w = w;
    self->mix = mix;
    return 0;
}

/* Python's left[f] for the mix table: a negative f counts from the end, as a list index
   does (a share placed beyond a GPU's free threads leaves it negative). -1 with IndexError
   where Python raises it. */
static int
left_at(const PlanObject *plan, long long f, double *out)
{
    if (f >= 0 && f <= WHOLE) {
        *out = plan->left[f];
        return 0;
    }
    if (f > WHOLE) {
        /* frag.py: left[WHOLE] + (f - WHOLE), an int added to a float. */
        *out = plan->left[WHOLE] + (double)(f - WHOLE);
        return 0;
    }
    if (f >= -LEFT_LEN) {
        *out = plan->left[LEFT_LEN + f];
        return 0;
    }
    PyErr_SetString(PyExc_IndexError, "tuple index out of range");
    return -1;
}

/* float(a * b) for Python ints a, b >= 0 that fit a long long: the exact product, rounded
   once to a double, as Python converts its arbitrary-precision product. */
static double
exact_product(long long a, long long b)
{
    long long product;
    /* Converting a 64-bit integer rounds to nearest, ties to even, as Python's int to float
       does; the 128-bit product is there for the rare figure past 64 bits. */
    if (!__builtin_mul_overflow(a, b, &product))
        return (double)product;
    return (double)((__int128)a * (__int128)b);
}

/* The walk up the sorted free amounts both measures make per size: from `k`, past the GPUs
   too small for `need`, adding their free amounts to *sliver; where it stops. Never runs off
   the end: the callers stop at a size above the largest free amount first. */
static inline Py_ssize_t
below(const long long *free, Py_ssize_t k, long long need, long long *sliver)
{
    while (free[k] < need) {
        *sliver += free[k];
        k++;
    }
    return k;
}

/* frag.py's Fragmentation._compute on free amounts sorted ascending (n of them). */
static int
frag_value(const PlanObject *plan, long long cpu, const long long *free, Py_ssize_t n,
           double *out)
{
    long long idle = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        idle += free[i];
    if (idle == 0) {
        *out = 0.0;
        return 0;
    }
    double w = plan->w;
    double total = plan->cpu_only * (double)idle;
    long long top = free[n - 1];
    Py_ssize_t k = 0;
    long long sliver = 0;
    if (plan->mix && w > 0.0) {
        double room = 0.0;
        if (free[0] >= 0 && top <= WHOLE) {
            for (Py_ssize_t i = 0; i < n; i++)
                room += plan->gaps[free[i]];
        }
        else {
            for (Py_ssize_t i = 0; i < n; i++) {
                double l;
                if (left_at(plan, free[i], &l) < 0)
                    return -1;
                room += (double)free[i] - l;
            }
        }
        double keep = 1.0 - w;
        double open_room = w * ((double)idle - room);
        for (Py_ssize_t g = 0; g < plan->ngroups; g++) {
            const Group *group = &plan->groups[g];
            long long need = group->need;
            if (need > top) {
                total += group->rest * (double)idle;
                break;
            }
            k = below(free, k, need, &sliver);
            long long big = n - k;
            double kept = keep * (double)sliver;
            double unlimited = kept + open_room;
            const Task *task = &plan->tasks[group->first];
            for (Py_ssize_t i = 0; i < group->count; i++, task++) {
                if (big < task->gpus || cpu < task->cpu || !task->allowed) {
                    total += task->p * (double)idle;
                    continue;
                }
                if (task->cpu > 0) {
                    double by_cpu = exact_product(cpu / task->cpu, task->ask);
                    if (by_cpu < room) {
                        total += task->p * (kept + w * ((double)idle - by_cpu));
                        continue;
                    }
                }
                total += task->p * unlimited;
            }
        }
        *out = total;
        return 0;
    }
    double keep = 1.0 - w;
    for (Py_ssize_t g = 0; g < plan->ngroups; g++) {
        const Group *group = &plan->groups[g];
        long long need = group->need;
        if (need > top) {
            total += group->rest * (double)idle;
            break;
        }
        k = below(free, k, need, &sliver);
        long long big = n - k;
        long long slots = -1;
        const Task *task = &plan->tasks[group->first];
        for (Py_ssize_t i = 0; i < group->count; i++, task++) {
            if (big < task->gpus || cpu < task->cpu || !task->allowed) {
                total += task->p * (double)idle;
                continue;
            }
            if (w == 0.0) {
                total += task->p * (double)sliver;
                continue;
            }
            long long times;
            if (need >= WHOLE) {
                times = big / task->gpus;
            }
            else {
                if (slots < 0) {
                    slots = 0;
                    for (Py_ssize_t j = k; j < n; j++)
                        slots += free[j] / need;
                }
                times = slots;
            }
            if (task->cpu > 0 && cpu / task->cpu < times)
                times = cpu / task->cpu;
            total += task->p * (keep * (double)sliver + w * (double)(idle - times * task->ask));
        }
    }
    *out = total;
    return 0;
}

/* fgd.py's fgd_score. */
static long
fgd_score(double delta)
{
    double d = delta / DELTA_SCALE;
    double m = d < EXP_LIMIT ? d : EXP_LIMIT;
    double x = m > -EXP_LIMIT ? m : -EXP_LIMIT;
    return (long)(100.0 / (1.0 + exp(-x)));
}

static int
compare_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* Read a tuple of ints into `out` (at most MAX_GPUS); its length, or -1 with an exception. */
static Py_ssize_t
read_amounts(PyObject *seq, long long *out, const char *what)
{
    if (!PyTuple_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s must be a tuple of ints", what);
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    if (n > MAX_GPUS) {
        PyErr_Format(PyExc_ValueError, "%s: more than %d GPUs", what, MAX_GPUS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (as_ll(PyTuple_GET_ITEM(seq, i), &out[i]) < 0)
            return -1;
    }
    return n;
}

/* Plan.value(cpu, free_sorted) -> float: F of the node (frag.py's value_sorted). */
static PyObject *
Plan_value(PlanObject *self, PyObject *args)
{
    long long cpu;
    PyObject *free_obj;
    long long free[MAX_GPUS];
    if (!PyArg_ParseTuple(args, "LO", &cpu, &free_obj))
        return NULL;
    Py_ssize_t n = read_amounts(free_obj, free, "free");
    if (n < 0)
        return NULL;
    double value;
    if (frag_value(self, cpu, free, n, &value) < 0)
        return NULL;
    return PyFloat_FromDouble(value);
}

/* fgd.py's _taken: `ordered` with one GPU's free amount going from f to v, in place of the
   first f, the new amount before the amounts it is not above (among those before it). */
static void
taken(const long long *ordered, Py_ssize_t n, Py_ssize_t i, long long v, long long *out)
{
    /* out = ordered without index i */
    Py_ssize_t m = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (j != i)
            out[m++] = ordered[j];
    }
    Py_ssize_t j = 0;
    while (j < i && out[j] < v)
        j++;
    for (Py_ssize_t q = n - 1; q > j; q--)
        out[q] = out[q - 1];
    out[j] = v;
}

/* FgdPolicy.score of the pod shape (pod_cpu, threads, gpus) on the node (free amounts in GPU
   index order, n of them), the candidate GPUs by index: the score into *best, the chosen GPU
   (or -1 for none) into *chosen. -1 with an exception set where Python raises. */
static int
fgd_policy_score(const PlanObject *plan, long long cpu_free, const long long *free, Py_ssize_t n,
                 long long pod_cpu, long long threads, long long gpus, const long long *cand,
                 Py_ssize_t ncand, long *best_out, Py_ssize_t *chosen_out)
{
    long long ordered[MAX_GPUS], after[MAX_GPUS];
    memcpy(ordered, free, (size_t)n * sizeof(long long));
    qsort(ordered, (size_t)n, sizeof(long long), compare_ll);
    double before, value;
    if (frag_value(plan, cpu_free, ordered, n, &before) < 0)
        return -1;
    long long cpu = cpu_free - pod_cpu;
    int is_share = gpus == 1 && threads > 0 && threads < WHOLE;
    if (!is_share) {
        memcpy(after, free, (size_t)n * sizeof(long long));
        if (gpus > 0) {
            long long sorted_cand[MAX_GPUS];
            memcpy(sorted_cand, cand, (size_t)ncand * sizeof(long long));
            qsort(sorted_cand, (size_t)ncand, sizeof(long long), compare_ll);
            for (Py_ssize_t i = 0; i < ncand && i < gpus; i++)
                after[sorted_cand[i]] = 0;
        }
        qsort(after, (size_t)n, sizeof(long long), compare_ll);
        if (frag_value(plan, cpu, after, n, &value) < 0)
            return -1;
        *best_out = fgd_score(before - value);
        *chosen_out = -1;
        return 0;
    }
    long best = -1;
    Py_ssize_t chosen = -1;
    long long tried_free[MAX_GPUS];
    long tried_score[MAX_GPUS];
    Py_ssize_t ntried = 0;
    for (Py_ssize_t c = 0; c < ncand; c++) {
        long long g = cand[c];
        long long f = free[g];
        long s = 0;
        Py_ssize_t t = 0;
        while (t < ntried && tried_free[t] != f)
            t++;
        if (t < ntried) {
            s = tried_score[t];
        }
        else {
            Py_ssize_t i = 0;
            while (ordered[i] != f)
                i++;
            taken(ordered, n, i, f - threads, after);
            if (frag_value(plan, cpu, after, n, &value) < 0)
                return -1;
            s = fgd_score(before - value);
            tried_free[ntried] = f;
            tried_score[ntried] = s;
            ntried++;
        }
        if (s > best || (s == best && chosen >= 0 && f < free[chosen])) {
            best = s;
            chosen = (Py_ssize_t)g;
        }
    }
    *best_out = best;
    *chosen_out = chosen;
    return 0;
}

/* Read GPU indexes (a sequence of ints, each < n) into `out`; their count, or -1. */
static Py_ssize_t
read_candidates(PyObject *seq, Py_ssize_t n, long long *out)
{
    PyObject *cands = PySequence_Fast(seq, "candidates must be a sequence of GPU indexes");
    if (cands == NULL)
        return -1;
    Py_ssize_t ncand = PySequence_Fast_GET_SIZE(cands);
    PyObject **items = PySequence_Fast_ITEMS(cands);
    Py_ssize_t result = ncand;
    if (ncand > MAX_GPUS) {
        PyErr_Format(PyExc_ValueError, "candidates: more than %d GPUs", MAX_GPUS);
        result = -1;
    }
    for (Py_ssize_t i = 0; result >= 0 && i < ncand; i++) {
        if (as_ll(items[i], &out[i]) < 0) {
            result = -1;
        }
        else if (out[i] < 0 || out[i] >= n) {
            PyErr_SetString(PyExc_IndexError, "tuple index out of range");
            result = -1;
        }
    }
    Py_DECREF(cands);
    return result;
}

/* Plan.score(cpu_free, free, pod_cpu, threads, gpus, candidates) -> (float, int | None):
   FgdPolicy.score of the pod shape (cpu, threads, gpus) on the node (free in GPU index
   order), the candidate GPUs by index. */
static PyObject *
Plan_score(PlanObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "score(cpu_free, free, pod_cpu, threads, gpus, candidates)");
        return NULL;
    }
    long long cpu_free, pod_cpu, threads, gpus;
    long long free[MAX_GPUS], cand[MAX_GPUS];
    if (as_ll(args[0], &cpu_free) < 0 || as_ll(args[2], &pod_cpu) < 0 ||
        as_ll(args[3], &threads) < 0 || as_ll(args[4], &gpus) < 0)
        return NULL;
    Py_ssize_t n = read_amounts(args[1], free, "free");
    if (n < 0)
        return NULL;
    Py_ssize_t ncand = read_candidates(args[5], n, cand);
    if (ncand < 0)
        return NULL;
    long best;
    Py_ssize_t chosen;
    if (fgd_policy_score(self, cpu_free, free, n, pod_cpu, threads, gpus, cand, ncand, &best,
                         &chosen) < 0)
        return NULL;
    if (chosen < 0)
        return Py_BuildValue("(dO)", (double)best, Py_None);
    return Py_BuildValue("(dn)", (double)best, chosen);
}

static PyMethodDef Plan_methods[] = {
    {"value", (PyCFunction)Plan_value, METH_VARARGS,
     "value(cpu, free_sorted) -> float: the fragmentation of the node."},
    {"score", (PyCFunction)(void (*)(void))Plan_score, METH_FASTCALL,
     "score(cpu_free, free, pod_cpu, threads, gpus, candidates) -> (float, int | None)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "extender.packing._native.Plan",
    .tp_doc = "One node type's compiled fragmentation measure and FGD score.",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
};

/* ---- fit: which GPUs of a node can take a share (fit.py's _fit_share, ledger.share_cause) */

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
