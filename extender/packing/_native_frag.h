/* The fragmentation measure of one node type in C (policies/frag.py): the Plan object's layout,
   the per-node value F and FGD's score of a change in it (policies/fgd.py). Included once, by
   _native.c (one translation unit, so that every function stays static and inlinable). */

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

/* frag.py's _room: M's GPU room on free amounts sorted ascending (n of them, `top` the
   largest); -1 with IndexError where Python raises it. */
static int
mix_room(const PlanObject *plan, const long long *free, Py_ssize_t n, long long top,
         double *out)
{
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
    *out = room;
    return 0;
}

/* frag.py's Fragmentation._compute on free amounts sorted ascending (n of them): one walk for
   L and M alike. */
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
    int mix = plan->mix && w > 0.0;
    double room = 0.0;
    if (mix && mix_room(plan, free, n, top, &room) < 0)
        return -1;
    double keep = 1.0 - w;
    double open_room = w * ((double)idle - room);
    Py_ssize_t k = 0;
    long long sliver = 0;
    for (Py_ssize_t g = 0; g < plan->ngroups; g++) {
        const Group *group = &plan->groups[g];
        long long need = group->need;
        if (need > top) {
            total += group->rest * (double)idle;
            break;
        }
        /* free[:k] are the GPUs too small for `need`; sliver = their sum. Never runs off the
           end: the walk stops at a size above the largest free amount first. */
        while (free[k] < need) {
            sliver += free[k];
            k++;
        }
        long long big = n - k;
        double kept = keep * (double)sliver;
        double unlimited = kept + open_room;
        long long slots = -1;
        const Task *task = &plan->tasks[group->first];
        for (Py_ssize_t i = 0; i < group->count; i++, task++) {
            if (big < task->gpus || cpu < task->cpu || !task->allowed) {
                total += task->p * (double)idle;
                continue;
            }
            if (mix) {
                if (task->cpu > 0) {
                    double by_cpu = exact_product(cpu / task->cpu, task->ask);
                    if (by_cpu < room) {
                        total += task->p * (kept + w * ((double)idle - by_cpu));
                        continue;
                    }
                }
                total += task->p * unlimited;
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
            total += task->p * (kept + w * (double)(idle - times * task->ask));
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
