/* The optional C accelerator of acp_proxy.wire.scan (issue 13, pass-through speed).
 *
 * Contract: exactly ``acp_proxy.wire.scan.scan_py`` (the pure-Python reference; read its
 * docstring for the meaning of the result), in one pass over the block: memchr finds each
 * newline, two byte compares check that the line starts like ``{"``, and each needle is searched
 * inside the line while it is hot in the cache. Pure: no I/O, no global state, no allocation
 * beyond the result. Only the CPython C API; built by setup.py as an optional extension (a
 * failed build leaves the pure-Python fallback in charge).
 *
 * Why not ``bytes.find`` per needle: JSON is full of ``"``, the first byte of most needles, so
 * CPython's search runs at 1-2 GB/s per needle, over the whole block once per needle. Here a
 * needle of two bytes or more is found with the SSE2 "first and last byte" filter (Wojciech
 * Mula's generic SIMD substring search): 16 candidate positions per step, each surviving one
 * checked with memcmp; without SSE2 a memchr on the needle's first byte plus memcmp.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#if defined(__SSE2__) || defined(_M_X64) || (defined(_M_IX86_FP) && _M_IX86_FP >= 2)
#include <emmintrin.h>
#define SCAN_SSE2 1
#endif

typedef struct {
    const char *p;
    Py_ssize_t n;
} needle_t;

/* Whether ``nd`` occurs in ``h[0:len]``. */
static int
contains(const char *h, Py_ssize_t len, const needle_t *nd)
{
    Py_ssize_t k = nd->n;
    if (k == 0)
        return 1;
    if (k > len)
        return 0;
    if (k == 1)
        return memchr(h, (unsigned char)nd->p[0], (size_t)len) != NULL;
    const char *np = nd->p;
    Py_ssize_t i = 0;
#ifdef SCAN_SSE2
    {
        const __m128i first = _mm_set1_epi8(np[0]);
        const __m128i last = _mm_set1_epi8(np[k - 1]);
        /* Block i covers start positions i..i+15; its last-byte load reads up to i+15+k-1. */
        for (; i + 16 + k - 1 <= len; i += 16) {
            __m128i a = _mm_loadu_si128((const __m128i *)(h + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(h + i + k - 1));
            unsigned mask = (unsigned)_mm_movemask_epi8(
                _mm_and_si128(_mm_cmpeq_epi8(a, first), _mm_cmpeq_epi8(b, last)));
            while (mask) {
#if defined(__GNUC__) || defined(__clang__)
                int bit = __builtin_ctz(mask);
#else
                int bit = 0;
                while (!((mask >> bit) & 1u))
                    bit++;
#endif
                if (memcmp(h + i + bit + 1, np + 1, (size_t)(k - 2)) == 0)
                    return 1;
                mask &= mask - 1;
            }
        }
    }
#endif
    /* The rest (or everything without SSE2): memchr on the first byte, then memcmp. */
    while (i + k <= len) {
        const char *f = memchr(h + i, (unsigned char)np[0], (size_t)(len - k + 1 - i));
        if (f == NULL)
            return 0;
        if (memcmp(f + 1, np + 1, (size_t)(k - 1)) == 0)
            return 1;
        i = (f - h) + 1;
    }
    return 0;
}

static int
append_line(PyObject *out, Py_ssize_t index, Py_ssize_t start, Py_ssize_t stop)
{
    PyObject *t = Py_BuildValue("(nnn)", index, start, stop);
    if (t == NULL)
        return -1;
    int rc = PyList_Append(out, t);
    Py_DECREF(t);
    return rc;
}

static PyObject *
scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "scan(raw, needles) takes exactly 2 arguments");
        return NULL;
    }
    PyObject *raw = args[0], *needles = args[1];
    if (!PyBytes_Check(raw)) {
        PyErr_SetString(PyExc_TypeError, "scan: raw must be bytes");
        return NULL;
    }
    if (!PyTuple_Check(needles)) {
        PyErr_SetString(PyExc_TypeError, "scan: needles must be a tuple of bytes");
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(needles);
    needle_t stack[16];
    needle_t *nds = stack;
    if (count > 16) {
        nds = PyMem_Malloc((size_t)count * sizeof(needle_t));
        if (nds == NULL)
            return PyErr_NoMemory();
    }
    Py_ssize_t kept = 0;
    int every = 0; /* an empty needle occurs in every line */
    for (Py_ssize_t j = 0; j < count; j++) {
        PyObject *nd = PyTuple_GET_ITEM(needles, j);
        if (!PyBytes_Check(nd)) {
            if (nds != stack)
                PyMem_Free(nds);
            PyErr_SetString(PyExc_TypeError, "scan: needles must be a tuple of bytes");
            return NULL;
        }
        const char *p = PyBytes_AS_STRING(nd);
        Py_ssize_t n = PyBytes_GET_SIZE(nd);
        if (n == 0)
            every = 1;
        else if (memchr(p, '\n', (size_t)n) == NULL) { /* else it never occurs inside a line */
            nds[kept].p = p;
            nds[kept].n = n;
            kept++;
        }
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        if (nds != stack)
            PyMem_Free(nds);
        return NULL;
    }
    /* The bytes object is immutable and we hold a reference through args: no copy needed. */
    const char *buf = PyBytes_AS_STRING(raw);
    Py_ssize_t size = PyBytes_GET_SIZE(raw);
    Py_ssize_t start = 0, index = 0;
    for (;;) {
        const char *nl = memchr(buf + start, '\n', (size_t)(size - start));
        Py_ssize_t stop = nl == NULL ? size : nl - buf;
        Py_ssize_t len = stop - start;
        const char *line = buf + start;
        int special = every || len < 2 || line[0] != '{' || line[1] != '"';
        for (Py_ssize_t j = 0; !special && j < kept; j++)
            special = contains(line, len, &nds[j]);
        if (special && append_line(out, index, start, stop) < 0) {
            Py_DECREF(out);
            if (nds != stack)
                PyMem_Free(nds);
            return NULL;
        }
        index++;
        if (nl == NULL)
            break;
        start = stop + 1;
    }
    if (nds != stack)
        PyMem_Free(nds);
    PyObject *res = Py_BuildValue("(nN)", index, out);
    return res;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(raw, needles) -> (lines, specials): see acp_proxy.wire.scan.scan_py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "acp_proxy.wire._scan",
    "The C accelerator of acp_proxy.wire.scan (optional; same contract as scan_py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__scan(void)
{
    return PyModule_Create(&module);
}
