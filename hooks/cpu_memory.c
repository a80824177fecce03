/* Counting NumPy data allocator for the CPU device (hooks/cpu_memory.py builds and loads it).
 *
 * NumPy (>= 1.22, NEP 49) lets a program choose the allocator of array data per context. This
 * one forwards to malloc/calloc/realloc/free and counts the bytes live and their peak, so the
 * CPU device can measure what a training step really holds at once -- feature maps, their
 * gradients, im2col columns and every other temporary -- the way a GPU memory pool does, with
 * no Python object overhead mixed in. Each block carries its size in a 16-byte header (realloc
 * does not get the old size), which keeps NumPy's 16-byte alignment.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define NPY_TARGET_VERSION NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define HEADER 16

static atomic_llong live = 0;
static atomic_llong peak = 0;
static atomic_llong window = 0;      /* a second peak, restarted per op by the profiler */
static atomic_llong blocks = 0;

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
    memcpy(raw, &size, sizeof(size));
    grew((long long)size);
    atomic_fetch_add(&blocks, 1);
    return raw + HEADER;
}

static void *count_malloc(void *ctx, size_t size) {
    (void)ctx;
    return with_header(malloc(size + HEADER), size);
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
    size_t had;
    memcpy(&had, raw, sizeof(had));
    atomic_fetch_sub(&live, (long long)had);
    atomic_fetch_sub(&blocks, 1);
    free(raw);
}

static void *count_realloc(void *ctx, void *ptr, size_t new_size) {
    if (ptr == NULL) {
        return count_malloc(ctx, new_size);
    }
    char *raw = (char *)ptr - HEADER;
    size_t had;
    memcpy(&had, raw, sizeof(had));
    char *moved = realloc(raw, new_size + HEADER);
    if (moved == NULL) {
        return NULL;
    }
    memcpy(moved, &new_size, sizeof(new_size));
    atomic_fetch_sub(&live, (long long)had);
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

static PyObject *py_live(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLongLong(atomic_load(&live));
}

static PyObject *py_peak(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLongLong(atomic_load(&peak));
}

static PyObject *py_blocks(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLongLong(atomic_load(&blocks));
}

static PyObject *py_reset_peak(PyObject *self, PyObject *unused) {
    /* The peak starts again from what is live now; returns the peak it had. */
    (void)self;
    (void)unused;
    long long had = atomic_exchange(&peak, atomic_load(&live));
    return PyLong_FromLongLong(had);
}

static PyObject *py_window(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyLong_FromLongLong(atomic_load(&window));
}

static PyObject *py_reset_window(PyObject *self, PyObject *unused) {
    /* The window's peak starts again from what is live now; returns the peak it had. */
    (void)self;
    (void)unused;
    long long had = atomic_exchange(&window, atomic_load(&live));
    return PyLong_FromLongLong(had);
}

static PyMethodDef methods[] = {
    {"window", py_window, METH_NOARGS, "Most counted bytes alive at once since reset_window()."},
    {"reset_window", py_reset_window, METH_NOARGS, "Restart the window's peak from live."},
    {"use", py_use, METH_O, "Count NumPy data allocations in this context (True) or not."},
    {"live", py_live, METH_NOARGS, "Bytes of counted array data alive now."},
    {"peak", py_peak, METH_NOARGS, "Most counted bytes alive at once since reset_peak()."},
    {"blocks", py_blocks, METH_NOARGS, "Counted blocks alive now."},
    {"reset_peak", py_reset_peak, METH_NOARGS, "Restart the peak from the live bytes."},
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
