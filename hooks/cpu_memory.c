/* Counting NumPy data allocator for the CPU device (hooks/cpu_memory.py builds and loads it).
 *
 * NumPy (>= 1.22, NEP 49) lets a program choose the allocator of array data per context. This
 * one forwards to malloc/calloc/realloc/free and counts the bytes live and their peak, so the
 * CPU device can measure what a training step really holds at once -- feature maps, their
 * gradients, im2col columns and every other temporary -- the way a GPU memory pool does, with
 * no Python object overhead mixed in. Each block carries its size and its epoch in a 16-byte
 * header (realloc does not get the old size), which keeps NumPy's 16-byte alignment.
 *
 * Epochs: ``begin()`` starts a new count from zero; blocks of earlier epochs (arrays of an
 * earlier run in the same process, still alive) no longer count, not even when freed, so one
 * device's figures never include another's leftovers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define NPY_TARGET_VERSION NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define HEADER 16

static atomic_llong live = 0;
static atomic_llong peak = 0;
static atomic_llong window = 0;      /* a second peak, restarted per op by the profiler */
static atomic_llong blocks = 0;
static atomic_llong epoch = 0;

typedef struct {
    size_t size;
    long long epoch;
} header_t;

static void raise_to(atomic_llong *top, long long now) {
    long long seen = atomic_load(top);
    while (now > seen && !atomic_compare_exchange_weak(top, &seen, now)) {
    }
}

static void grew(long long n) {
    long long now = atomic_fetch_add(&live, n) + n;
    raise_to(&peak, now);
    raise_to(&window, now);
}

static void *with_header(char *raw, size_t size) {
    if (raw == NULL) {
        return NULL;
    }
    header_t header = {size, atomic_load(&epoch)};
    memcpy(raw, &header, sizeof(header));
    grew((long long)size);
    atomic_fetch_add(&blocks, 1);
    return raw + HEADER;
}

static void *huge_pages(char *raw, size_t size) {
    /* As NumPy's own allocator does: ask for huge pages on large blocks (fewer page faults
     * when a fresh feature map is first written; without it a training step ran ~25% slower). */
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (raw != NULL && size >= ((size_t)1 << 22)) {
        uintptr_t start = ((uintptr_t)raw + 4095) & ~(uintptr_t)4095;
        uintptr_t end = (uintptr_t)raw + size + HEADER;
        if (end > start) {
            madvise((void *)start, end - start, MADV_HUGEPAGE);
        }
    }
#endif
    return raw;
}

static void *count_malloc(void *ctx, size_t size) {
    (void)ctx;
    return with_header(huge_pages(malloc(size + HEADER), size), size);
}

static void *count_calloc(void *ctx, size_t nelem, size_t elsize) {
    (void)ctx;
    size_t size = nelem * elsize;
    if (elsize != 0 && size / elsize != nelem) {
        return NULL;
    }
    return with_header(calloc(1, size + HEADER), size);
}

static void count_free(void *ctx, void *ptr, size_t size) {
    (void)ctx;
    (void)size;
    if (ptr == NULL) {
        return;
    }
    char *raw = (char *)ptr - HEADER;
    header_t had;
    memcpy(&had, raw, sizeof(had));
    if (had.epoch == atomic_load(&epoch)) {
        atomic_fetch_sub(&live, (long long)had.size);
        atomic_fetch_sub(&blocks, 1);
    }
    free(raw);
}

static void *count_realloc(void *ctx, void *ptr, size_t new_size) {
    if (ptr == NULL) {
        return count_malloc(ctx, new_size);
    }
    char *raw = (char *)ptr - HEADER;
    header_t had;
    memcpy(&had, raw, sizeof(had));
    char *moved = realloc(raw, new_size + HEADER);
    if (moved == NULL) {
        return NULL;
    }
    header_t header = {new_size, atomic_load(&epoch)};
    memcpy(moved, &header, sizeof(header));
    if (had.epoch == header.epoch) {
        atomic_fetch_sub(&live, (long long)had.size);
    } else {
        atomic_fetch_add(&blocks, 1);
    }
    grew((long long)new_size);
    return moved + HEADER;
}

static PyDataMem_Handler counting_handler = {
    "pooch_ext_counting",
    1,
    {NULL, count_malloc, count_calloc, count_realloc, count_free},
};

static PyObject *handler_capsule = NULL;

static PyObject *py_use(PyObject *self, PyObject *arg) {
    /* use(True): count the arrays allocated from now on in this context; use(False): NumPy's
     * default allocator again. Returns whether counting was on before. */
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0) {
        return NULL;
    }
    PyObject *previous = PyDataMem_SetHandler(on ? handler_capsule : NULL);
    if (previous == NULL) {
        return NULL;
    }
    int was = previous == handler_capsule;
    Py_DECREF(previous);
    return PyBool_FromLong(was);
}

static atomic_llong *const counters[] = {&live, &peak, &window, &blocks};

static PyObject *read_counter(PyObject *self, PyObject *arg) {
    /* read(k): the counter k of live, peak, window, blocks (cpu_memory.py names them). */
    (void)self;
    long k = PyLong_AsLong(arg);
    if (k < 0 || k >= (long)(sizeof(counters) / sizeof(counters[0]))) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_IndexError, "no such counter");
        }
        return NULL;
    }
    return PyLong_FromLongLong(atomic_load(counters[k]));
}

static PyObject *restart(PyObject *self, PyObject *arg) {
    /* restart(k): peak (1) or window (2) starts again from what is live now; returns it had. */
    (void)self;
    long k = PyLong_AsLong(arg);
    if (k != 1 && k != 2) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_IndexError, "only the peak (1) and the window (2) restart");
        }
        return NULL;
    }
    return PyLong_FromLongLong(atomic_exchange(counters[k], atomic_load(&live)));
}

static PyObject *lift(PyObject *self, PyObject *args) {
    /* lift(k, value): peak (1) or window (2) at least value (after a restart, what it had
     * before a block that is not the device's, e.g. measurements on probes). */
    (void)self;
    long k;
    long long value;
    if (!PyArg_ParseTuple(args, "lL", &k, &value)) {
        return NULL;
    }
    if (k != 1 && k != 2) {
        PyErr_SetString(PyExc_IndexError, "only the peak (1) and the window (2) lift");
        return NULL;
    }
    raise_to(counters[k], value);
    Py_RETURN_NONE;
}

static PyObject *begin(PyObject *self, PyObject *unused) {
    /* A new epoch: every count from zero; blocks allocated before no longer count. */
    (void)self;
    (void)unused;
    atomic_fetch_add(&epoch, 1);
    for (size_t k = 0; k < sizeof(counters) / sizeof(counters[0]); k++) {
        atomic_store(counters[k], 0);
    }
    Py_RETURN_NONE;
}

static PyObject *counted_size(PyObject *self, PyObject *arg) {
    /* counted_size(address): the size of the counting allocator's block at that data
     * address if it counts in this epoch, else 0. Only for data this allocator owns. */
    (void)self;
    void *ptr = PyLong_AsVoidPtr(arg);
    if (ptr == NULL) {
        return PyErr_Occurred() ? NULL : PyLong_FromLong(0);
    }
    header_t had;
    memcpy(&had, (char *)ptr - HEADER, sizeof(had));
    return PyLong_FromLongLong(had.epoch == atomic_load(&epoch) ? (long long)had.size : 0);
}

static PyMethodDef methods[] = {
    {"use", py_use, METH_O, "Count NumPy data allocations in this context (True) or not."},
    {"read", read_counter, METH_O, "Counter k: live, peak, window, blocks."},
    {"restart", restart, METH_O, "Restart the peak (1) or the window (2) from live."},
    {"lift", lift, METH_VARARGS, "Raise the peak (1) or the window (2) to at least a value."},
    {"counted_size", counted_size, METH_O, "Bytes the block at this data address counts."},
    {"begin", begin, METH_NOARGS, "A new epoch: counts from zero, older blocks not counted."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pooch_cpu_memory", NULL, -1, methods,
};

PyMODINIT_FUNC PyInit__pooch_cpu_memory(void) {
    import_array();
    handler_capsule = PyCapsule_New(&counting_handler, "mem_handler", NULL);
    if (handler_capsule == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
