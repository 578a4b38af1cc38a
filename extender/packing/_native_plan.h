/* The Plan type (one node type's compiled measure, _native_frag.h): building it from the
   policy's task table, and its value and score methods, FGD's choice of GPU among the
   candidates included. Included once, by _native.c, after _native_frag.h. */

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
