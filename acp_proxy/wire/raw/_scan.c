/* The optional C accelerator of acp_proxy.wire.raw.block_scan, for pass-through speed.
 *
 * Contract: exactly ``acp_proxy.wire.raw.block_scan.scan_py`` (the pure-Python reference; read its
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
 * checked byte by byte; without SSE2 a memchr on the needle's first byte plus that check.
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

/* Whether ``a[0:n]`` equals ``b[0:n]``: inline for the middle of the usual needles (``"id"``
 * has two bytes there, and ``":{"`` or ``"},"`` pass the first-and-last-byte filter all the
 * time in JSON), where a call to memcmp cost more than the compare. */
static inline int
same(const char *a, const char *b, Py_ssize_t n)
{
    if (n > 16)
        return memcmp(a, b, (size_t)n) == 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

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
                if (same(h + i + bit + 1, np + 1, k - 2))
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
        if (same(f + 1, np + 1, k - 1))
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


/* ---- member_span: where a member sits in a frame (the fused annotation path) ----
 *
 * Contract: the fast path of ``acp_proxy.wire.raw.rawjson.member_span_py`` (read its docstring).
 * ``raw`` has been parsed by orjson already, so it is valid JSON; the walk below only skips
 * values (strings by their quotes and escapes, containers by depth, scalars up to their
 * delimiter). ``None`` whenever anything is unusual (a key with an escape in an object on the
 * path, a key given twice, no object where one is expected): the caller then takes the
 * pure-Python path, which knows every case.
 */

static Py_ssize_t
ws(const char *b, Py_ssize_t i, Py_ssize_t n)
{
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r'))
        i++;
    return i;
}

/* The offset after the string whose opening quote is at b[i]; -1 if it does not close. */
static Py_ssize_t
string_end(const char *b, Py_ssize_t i, Py_ssize_t n)
{
    i++;
    for (;;) {
        const char *q = memchr(b + i, '"', (size_t)(n - i));
        if (q == NULL)
            return -1;
        Py_ssize_t j = q - b;
        Py_ssize_t k = j; /* an odd run of backslashes before the quote escapes it */
        while (k > i && b[k - 1] == '\\')
            k--;
        if (((j - k) & 1) == 0)
            return j + 1;
        i = j + 1;
    }
}

/* The offset of the first byte at or after b[i] that is a quote, a brace or a bracket (n if
 * none): containers are skipped from one structural byte to the next, 16 bytes a step with SSE2
 * (a byte-by-byte loop made member_span cost ~25,000 instructions on a 1.5 KB update). */
static Py_ssize_t
next_structural(const char *b, Py_ssize_t i, Py_ssize_t n)
{
#ifdef SCAN_SSE2
    const __m128i quote = _mm_set1_epi8('"');
    /* '{' 0x7B and '[' 0x5B differ in one bit (0x20), as '}' 0x7D and ']' 0x5D do. */
    const __m128i fold = _mm_set1_epi8(0x20);
    const __m128i open = _mm_set1_epi8('{');
    const __m128i close = _mm_set1_epi8('}');
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(b + i));
        __m128i f = _mm_or_si128(v, fold);
        __m128i hit = _mm_or_si128(_mm_cmpeq_epi8(v, quote),
                                   _mm_or_si128(_mm_cmpeq_epi8(f, open), _mm_cmpeq_epi8(f, close)));
        unsigned mask = (unsigned)_mm_movemask_epi8(hit);
        if (mask) {
#if defined(__GNUC__) || defined(__clang__)
            return i + __builtin_ctz(mask);
#else
            int bit = 0;
            while (!((mask >> bit) & 1u))
                bit++;
            return i + bit;
#endif
        }
    }
#endif
    for (; i < n; i++) {
        char c = b[i];
        if (c == '"' || c == '{' || c == '}' || c == '[' || c == ']')
            return i;
    }
    return n;
}

/* The offset after the value that starts at b[i]; -1 on malformed input. */
static Py_ssize_t
value_end(const char *b, Py_ssize_t i, Py_ssize_t n)
{
    if (i >= n)
        return -1;
    char c = b[i];
    if (c == '"')
        return string_end(b, i, n);
    if (c == '{' || c == '[') {
        Py_ssize_t depth = 0;
        for (;;) {
            i = next_structural(b, i, n);
            if (i >= n)
                return -1;
            c = b[i];
            if (c == '"') {
                i = string_end(b, i, n);
                if (i < 0)
                    return -1;
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if (--depth == 0)
                return i + 1;
            i++;
        }
    }
    while (i < n) {
        c = b[i];
        if (c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r')
            break;
        i++;
    }
    return i;
}

typedef struct {
    Py_ssize_t start;    /* the object's opening brace */
    Py_ssize_t close;    /* its closing brace */
    Py_ssize_t vs, ve;   /* the wanted member's value, -1 if absent */
    Py_ssize_t last_end; /* the end of the last member's value, -1 if the object is empty */
} members_t;

/* Walk the members of the object at b[i] == '{' down ``path[depth:]`` and then to ``key``,
 * in one pass: the member that is the next step is walked into (not skipped and walked again),
 * and the rest of each object on the way is still read, to refuse a step given twice. Fills
 * ``m`` for the last object. Returns the offset after this object's closing brace, or -1 when
 * the caller must give up (malformed, an escaped key, a step or ``key`` twice, a step that is
 * missing or not an object). */
static Py_ssize_t
walk(const char *b, Py_ssize_t i, Py_ssize_t n, PyObject *path, Py_ssize_t depth,
     const char *key, Py_ssize_t klen_want, members_t *m)
{
    if (i >= n || b[i] != '{')
        return -1;
    Py_ssize_t steps = PyTuple_GET_SIZE(path);
    int last = depth == steps;
    const char *want = key;
    Py_ssize_t wlen = klen_want;
    if (!last) {
        PyObject *step = PyTuple_GET_ITEM(path, depth);
        want = PyBytes_AS_STRING(step);
        wlen = PyBytes_GET_SIZE(step);
    }
    int found = 0;
    Py_ssize_t last_end = -1, vs_hit = -1, ve_hit = -1;
    Py_ssize_t j = ws(b, i + 1, n);
    Py_ssize_t close;
    if (j < n && b[j] == '}') {
        close = j;
    }
    else {
        for (;;) {
            if (j >= n || b[j] != '"')
                return -1;
            Py_ssize_t kend = string_end(b, j, n);
            if (kend < 0)
                return -1;
            const char *k = b + j + 1;
            Py_ssize_t klen = kend - j - 2;
            if (memchr(k, '\\', (size_t)klen) != NULL)
                return -1; /* an escaped key may spell ``want``: the Python path decodes it */
            Py_ssize_t c = ws(b, kend, n);
            if (c >= n || b[c] != ':')
                return -1;
            Py_ssize_t vs = ws(b, c + 1, n);
            Py_ssize_t ve;
            int hit = klen == wlen && memcmp(k, want, (size_t)wlen) == 0;
            if (hit && found)
                return -1; /* given twice: the parse kept the last one */
            if (hit && !last)
                ve = walk(b, vs, n, path, depth + 1, key, klen_want, m);
            else
                ve = value_end(b, vs, n);
            if (ve < 0)
                return -1;
            if (hit) {
                found = 1;
                vs_hit = vs;
                ve_hit = ve;
            }
            last_end = ve;
            j = ws(b, ve, n);
            if (j >= n)
                return -1;
            if (b[j] == '}') {
                close = j;
                break;
            }
            if (b[j] != ',')
                return -1;
            j = ws(b, j + 1, n);
        }
    }
    if (!last) {
        if (!found)
            return -1;
    }
    else {
        m->start = i;
        m->close = close;
        m->vs = vs_hit;
        m->ve = ve_hit;
        m->last_end = last_end;
    }
    return close + 1;
}

/* Check ``raw`` (bytes), ``path`` (a tuple of bytes) and ``key`` (bytes), then walk ``raw``
 * down ``path`` to ``key`` (``walk``). 1: found, ``m`` filled; 0: ``walk`` gave up; -1: a type
 * error is set (``who`` names the function). */
static int
locate(const char *who, PyObject *raw, PyObject *path, PyObject *key, members_t *m)
{
    int ok = PyBytes_Check(raw) && PyTuple_Check(path) && PyBytes_Check(key);
    for (Py_ssize_t s = 0; ok && s < PyTuple_GET_SIZE(path); s++)
        ok = PyBytes_Check(PyTuple_GET_ITEM(path, s));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: raw bytes, path a tuple of bytes, key bytes", who);
        return -1;
    }
    const char *b = PyBytes_AS_STRING(raw);
    Py_ssize_t n = PyBytes_GET_SIZE(raw);
    return walk(b, ws(b, 0, n), n, path, 0, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), m) >= 0;
}

static PyObject *
member_span(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "member_span(raw, path, key) takes 3 arguments");
        return NULL;
    }
    members_t m;
    int found = locate("member_span", args[0], args[1], args[2], &m);
    if (found < 0)
        return NULL;
    if (!found)
        Py_RETURN_NONE;
    return Py_BuildValue("(nnnnn)", m.start, m.close, m.vs, m.ve, m.last_end);
}

/* splice_member(raw, path, key, member_key, value, expect) -> bytes | None: ``raw`` with member
 * ``key`` of the object at ``path`` written as the encoded ``value``, in one pass and one copy
 * (the Python steps around member_span cost more than the walk). ``expect`` None:
 * the member must be absent, and ``member_key`` (``"key":``) + ``value`` is added last, after a
 * comma unless the object is empty (where ``rawjson.splice_member`` adds it). ``expect`` bytes:
 * the member's value must be exactly those bytes (the caller's canonical encoding of the old
 * value), and they are replaced by ``value``. ``None`` when anything differs from that, or where
 * member_span gives up: the caller takes its other paths. */
static PyObject *
splice_member(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "splice_member(raw, path, key, member_key, value, expect) takes 6 arguments");
        return NULL;
    }
    PyObject *raw = args[0], *member_key = args[3], *value = args[4], *expect = args[5];
    if (!PyBytes_Check(member_key) || !PyBytes_Check(value) ||
        (expect != Py_None && !PyBytes_Check(expect))) {
        PyErr_SetString(PyExc_TypeError, "splice_member: member_key, value, expect: bytes");
        return NULL;
    }
    members_t m;
    int found = locate("splice_member", raw, args[1], args[2], &m);
    if (found < 0)
        return NULL;
    if (!found)
        Py_RETURN_NONE;
    const char *b = PyBytes_AS_STRING(raw);
    Py_ssize_t n = PyBytes_GET_SIZE(raw);
    const char *v = PyBytes_AS_STRING(value);
    Py_ssize_t vlen = PyBytes_GET_SIZE(value);
    Py_ssize_t cut, resume;
    const char *mk = NULL;
    Py_ssize_t mklen = 0;
    int comma = 0;
    if (expect == Py_None) {
        if (m.vs >= 0)
            Py_RETURN_NONE;
        mk = PyBytes_AS_STRING(member_key);
        mklen = PyBytes_GET_SIZE(member_key);
        if (m.last_end < 0) {
            cut = resume = m.start + 1;
        }
        else {
            cut = resume = m.last_end;
            comma = 1;
        }
    }
    else {
        Py_ssize_t elen = PyBytes_GET_SIZE(expect);
        if (m.vs < 0 || m.ve - m.vs != elen ||
            memcmp(b + m.vs, PyBytes_AS_STRING(expect), (size_t)elen) != 0)
            Py_RETURN_NONE;
        cut = m.vs;
        resume = m.ve;
    }
    Py_ssize_t size = cut + comma + mklen + vlen + (n - resume);
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    char *o = PyBytes_AS_STRING(out);
    memcpy(o, b, (size_t)cut);
    o += cut;
    if (comma)
        *o++ = ',';
    if (mklen) {
        memcpy(o, mk, (size_t)mklen);
        o += mklen;
    }
    memcpy(o, v, (size_t)vlen);
    o += vlen;
    memcpy(o, b + resume, (size_t)(n - resume));
    return out;
}

/* array_elements(raw, i) -> (list of (start, end), close) | None: the elements of the array
 * whose '[' is at raw[i] in a frame orjson has parsed, and the offset of its ']': exactly
 * ``rawjson.array_elements`` (the reference), which walked a big batch in Python at ~10
 * instructions a byte. ``None`` on anything malformed (the caller takes the reference). */
static PyObject *
array_elements(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "array_elements(raw: bytes, i: int)");
        return NULL;
    }
    const char *b = PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0 || i >= n || b[i] != '[')
        Py_RETURN_NONE;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Py_ssize_t j = ws(b, i + 1, n);
    if (j < n && b[j] == ']')
        return Py_BuildValue("(Nn)", out, j);
    for (;;) {
        Py_ssize_t end = value_end(b, j, n);
        if (end < 0 || end == j)
            goto malformed;
        PyObject *span = Py_BuildValue("(nn)", j, end);
        if (span == NULL || PyList_Append(out, span) < 0) {
            Py_XDECREF(span);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(span);
        Py_ssize_t k = ws(b, end, n);
        if (k >= n)
            goto malformed;
        if (b[k] == ',') {
            j = ws(b, k + 1, n);
            continue;
        }
        if (b[k] != ']')
            goto malformed;
        return Py_BuildValue("(Nn)", out, k);
    }
malformed:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* ---- numbers_risky: the coalescer's number check ----
 *
 * Contract: exactly ``rawjson._risky_numbers(rawjson._outside_strings(raw))``: whether a number
 * outside the strings of ``raw`` has an exponent or a run of 17 digits and dots (orjson could
 * respell it). The Python reference walks the strings one ``find`` at a time, a quarter of the
 * coalescer's cost per line on real traffic (strings full of digits trip the cheap check that
 * comes first). An unterminated string answers True (the reference raises; the caller then
 * treats the frame as risky, the same outcome).
 */
static PyObject *
numbers_risky(PyObject *self, PyObject *raw)
{
    (void)self;
    if (!PyBytes_Check(raw)) {
        PyErr_SetString(PyExc_TypeError, "numbers_risky: raw must be bytes");
        return NULL;
    }
    const char *b = PyBytes_AS_STRING(raw);
    Py_ssize_t n = PyBytes_GET_SIZE(raw);
    Py_ssize_t run = 0; /* digits and dots in a row */
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = b[i];
        if (c == '"') {
            i = string_end(b, i, n);
            if (i < 0)
                Py_RETURN_TRUE;
            i--; /* the loop's i++ moves past the closing quote */
            run = 0; /* the reference joins the parts around a string with a space */
            continue;
        }
        if ((c >= '0' && c <= '9') || c == '.') {
            if (++run >= 17)
                Py_RETURN_TRUE;
            continue;
        }
        if ((c == 'e' || c == 'E') && run > 0)
            Py_RETURN_TRUE;
        run = 0;
    }
    Py_RETURN_FALSE;
}

/* ---- contains_py's accelerator: whether a needle occurs in a frame ----
 *
 * Contract: exactly ``needle in raw`` (``acp_proxy.wire.raw.block_scan.contains_py``), with the scan's
 * SSE2 search. The request tables test every frame that passes the block scan alone for
 * ``"id"`` (the line completing the last read's partial one, a batch): CPython's search ran
 * at about 1 GB/s there (JSON is full of ``"``) and long lines are the ones most often cut by
 * a read, so it was a tenth of the proxy's CPU on a stream of large updates.
 */
static PyObject *
contains_needle(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "contains(raw, needle) takes two bytes");
        return NULL;
    }
    needle_t nd = {PyBytes_AS_STRING(args[1]), PyBytes_GET_SIZE(args[1])};
    if (contains(PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), &nd))
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* ---- update_shape: a session/update line's shape, for the coalescer's bytes path ----
 *
 * Contract: exactly ``acp_proxy.wire.coalesce.shape.update_shape_py`` (the reference; read its
 * docstring for the result). One pass over the line that validates it as JSON (RFC 8259, as
 * orjson accepts it: strict UTF-8, no control characters in strings, only JSON's escapes, no
 * surrogate escape, numbers in JSON's grammar) and refuses what the coalescer never merges (an
 * exponent or 17 digits and dots in a row, ``\\u`` escapes of surrogates and what
 * ``rawscan.reencodes_exactly`` mistakes for one, nesting deeper than ``SHAPE_MAX_DEPTH``),
 * while it takes the envelope apart: ``{"jsonrpc":"2.0","method":"session/update",
 * "params":{"sessionId":S,"update":{...}}}`` in any order, nothing else, no key given twice or
 * spelled with an escape there. Builds only the few values of the result. ``None`` for anything
 * else: the caller then takes the path that parses.
 */

#define SHAPE_MAX_DEPTH 256
#define SHAPE_MAX_FIELDS 62
#define SHAPE_OTHER_BIT 62

/* The length of the strict UTF-8 sequence at s[0] (non-ASCII lead), 0 if invalid. */
static int
utf8_len(const unsigned char *s, Py_ssize_t avail)
{
    unsigned char c = s[0];
    if (c >= 0xC2 && c <= 0xDF) {
        return avail >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    }
    if (c >= 0xE0 && c <= 0xEF) {
        if (avail < 3 || (s[2] & 0xC0) != 0x80)
            return 0;
        unsigned char d = s[1];
        if (c == 0xE0)
            return d >= 0xA0 && d <= 0xBF ? 3 : 0;
        if (c == 0xED)
            return d >= 0x80 && d <= 0x9F ? 3 : 0; /* no surrogates */
        return (d & 0xC0) == 0x80 ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (avail < 4 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        unsigned char d = s[1];
        if (c == 0xF0)
            return d >= 0x90 && d <= 0xBF ? 4 : 0;
        if (c == 0xF4)
            return d >= 0x80 && d <= 0x8F ? 4 : 0;
        return (d & 0xC0) == 0x80 ? 4 : 0;
    }
    return 0;
}

static int
hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The offset after the valid string whose quote is at b[i], -1 if invalid or refused (a
 * surrogate escape, or an escaped backslash followed by what reencodes_exactly's pattern
 * ``\\[uU][dD][89a-fA-F]`` matches). ``*escaped`` is set when it holds an escape. */
static Py_ssize_t
shape_string(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int *escaped)
{
    i++;
    for (;;) {
#ifdef SCAN_SSE2
        {
            /* Skip 16 plain ASCII bytes at a time: none a quote, a backslash, a control
             * character or a non-ASCII byte (its sign bit: movemask sees it directly). */
            const __m128i quote = _mm_set1_epi8('"');
            const __m128i bslash = _mm_set1_epi8('\\');
            const __m128i ctl = _mm_set1_epi8(0x1F);
            while (i + 16 <= n) {
                __m128i v = _mm_loadu_si128((const __m128i *)(b + i));
                __m128i low = _mm_cmpeq_epi8(_mm_max_epu8(v, ctl), ctl); /* v < 0x20 */
                __m128i eq = _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash));
                unsigned mask = (unsigned)_mm_movemask_epi8(_mm_or_si128(_mm_or_si128(low, eq), v));
                if (mask) {
#if defined(__GNUC__) || defined(__clang__)
                    i += __builtin_ctz(mask);
#else
                    while (!(mask & 1u)) {
                        mask >>= 1;
                        i++;
                    }
#endif
                    break;
                }
                i += 16;
            }
        }
#endif
        if (i >= n)
            return -1;
        unsigned char c = b[i];
        if (c == '"')
            return i + 1;
        if (c == '\\') {
            if (i + 1 >= n)
                return -1;
            unsigned char e = b[i + 1];
            *escaped = 1;
            if (e == 'u') {
                if (i + 5 >= n)
                    return -1;
                int cp = 0;
                for (int k = 2; k < 6; k++) {
                    int h = hex_value(b[i + k]);
                    if (h < 0)
                        return -1;
                    cp = cp * 16 + h;
                }
                if (cp >= 0xD800 && cp <= 0xDFFF)
                    return -1;
                i += 6;
                continue;
            }
            if (e == '\\' && i + 4 < n && (b[i + 2] | 0x20) == 'u' && (b[i + 3] | 0x20) == 'd' &&
                ((b[i + 4] >= '8' && b[i + 4] <= '9') || ((b[i + 4] | 0x20) >= 'a' && (b[i + 4] | 0x20) <= 'f')))
                return -1;
            if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                e == 't') {
                i += 2;
                continue;
            }
            return -1;
        }
        if (c < 0x20)
            return -1;
        if (c < 0x80) {
            i++;
            continue;
        }
        int k = utf8_len(b + i, n - i);
        if (k == 0)
            return -1;
        i += k;
    }
}

/* The offset after the number at b[i], -1 if invalid or refused (an exponent, or 17 digits
 * and dots: ``numbers_risky``). */
static Py_ssize_t
shape_number(const unsigned char *b, Py_ssize_t i, Py_ssize_t n)
{
    Py_ssize_t j = i;
    if (j < n && b[j] == '-')
        j++;
    Py_ssize_t digits = j;
    if (j >= n)
        return -1;
    if (b[j] == '0')
        j++;
    else if (b[j] >= '1' && b[j] <= '9')
        while (j < n && b[j] >= '0' && b[j] <= '9')
            j++;
    else
        return -1;
    if (j < n && b[j] == '.') {
        j++;
        Py_ssize_t f = j;
        while (j < n && b[j] >= '0' && b[j] <= '9')
            j++;
        if (j == f)
            return -1;
    }
    if (j < n && (b[j] == 'e' || b[j] == 'E'))
        return -1;
    if (j - digits >= 17)
        return -1;
    return j;
}

static Py_ssize_t shape_value(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int depth);

/* A member key at b[i] ('"'): its end, -1 if invalid; ``*escaped`` as shape_string. */
static Py_ssize_t
shape_key(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int *escaped)
{
    if (i >= n || b[i] != '"')
        return -1;
    return shape_string(b, i, n, escaped);
}

/* The offset after the value of a member, whose key ended at b[i] (before the colon). */
static Py_ssize_t
shape_colon(const unsigned char *b, Py_ssize_t i, Py_ssize_t n)
{
    if (i + 1 < n && b[i] == ':' && b[i + 1] > ' ')
        return i + 1; /* (the usual spelling: no whitespace) */
    i = ws((const char *)b, i, n);
    if (i >= n || b[i] != ':')
        return -1;
    return ws((const char *)b, i + 1, n);
}

/* After a member's value ended at b[i]: the offset of the next key (after a comma), or of the
 * closing brace/bracket ``close`` (``*done`` set); -1 if invalid. */
static Py_ssize_t
shape_next(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, unsigned char close, int *done)
{
    if (i < n && b[i] > ' ') {
        /* (the usual spelling: no whitespace) */
    }
    else {
        i = ws((const char *)b, i, n);
        if (i >= n)
            return -1;
    }
    if (b[i] == ',') {
        *done = 0;
        i++;
        return i < n && b[i] > ' ' ? i : ws((const char *)b, i, n);
    }
    if (b[i] == close) {
        *done = 1;
        return i;
    }
    return -1;
}

static Py_ssize_t
shape_object(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int depth)
{
    Py_ssize_t j = ws((const char *)b, i + 1, n);
    if (j < n && b[j] == '}')
        return j + 1;
    for (;;) {
        int escaped = 0, done = 0;
        Py_ssize_t kend = shape_key(b, j, n, &escaped);
        if (kend < 0)
            return -1;
        Py_ssize_t vs = shape_colon(b, kend, n);
        if (vs < 0)
            return -1;
        Py_ssize_t ve = shape_value(b, vs, n, depth);
        if (ve < 0)
            return -1;
        j = shape_next(b, ve, n, '}', &done);
        if (j < 0)
            return -1;
        if (done)
            return j + 1;
    }
}

static Py_ssize_t
shape_array(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int depth)
{
    Py_ssize_t j = ws((const char *)b, i + 1, n);
    if (j < n && b[j] == ']')
        return j + 1;
    for (;;) {
        int done = 0;
        Py_ssize_t ve = shape_value(b, j, n, depth);
        if (ve < 0)
            return -1;
        j = shape_next(b, ve, n, ']', &done);
        if (j < 0)
            return -1;
        if (done)
            return j + 1;
    }
}

/* The offset after the valid value at b[i] (nested ``depth`` containers deep), -1 if none. */
static Py_ssize_t
shape_value(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int depth)
{
    if (i >= n)
        return -1;
    int escaped = 0;
    switch (b[i]) {
    case '"':
        return shape_string(b, i, n, &escaped);
    case '{':
        return depth >= SHAPE_MAX_DEPTH ? -1 : shape_object(b, i, n, depth + 1);
    case '[':
        return depth >= SHAPE_MAX_DEPTH ? -1 : shape_array(b, i, n, depth + 1);
    case 't':
        return i + 4 <= n && memcmp(b + i, "true", 4) == 0 ? i + 4 : -1;
    case 'f':
        return i + 5 <= n && memcmp(b + i, "false", 5) == 0 ? i + 5 : -1;
    case 'n':
        return i + 4 <= n && memcmp(b + i, "null", 4) == 0 ? i + 4 : -1;
    default:
        return shape_number(b, i, n);
    }
}

/* The str of the valid string literal b[s:e] (quotes included). */
static PyObject *
shape_decode(const unsigned char *b, Py_ssize_t s, Py_ssize_t e, int escaped)
{
    if (!escaped)
        return PyUnicode_DecodeUTF8((const char *)b + s + 1, e - s - 2, NULL);
    char *buf = PyMem_Malloc((size_t)(e - s));
    if (buf == NULL)
        return PyErr_NoMemory();
    Py_ssize_t o = 0;
    for (Py_ssize_t i = s + 1; i < e - 1;) {
        unsigned char c = b[i];
        if (c != '\\') {
            buf[o++] = (char)c;
            i++;
            continue;
        }
        unsigned char x = b[i + 1];
        if (x == 'u') {
            int cp = 0;
            for (int k = 2; k < 6; k++)
                cp = cp * 16 + hex_value(b[i + k]);
            if (cp < 0x80) {
                buf[o++] = (char)cp;
            }
            else if (cp < 0x800) {
                buf[o++] = (char)(0xC0 | (cp >> 6));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            }
            else {
                buf[o++] = (char)(0xE0 | (cp >> 12));
                buf[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                buf[o++] = (char)(0x80 | (cp & 0x3F));
            }
            i += 6;
            continue;
        }
        buf[o++] = x == 'b' ? '\b' : x == 'f' ? '\f' : x == 'n' ? '\n' : x == 'r' ? '\r'
                 : x == 't' ? '\t' : (char)x;
        i += 2;
    }
    PyObject *out = PyUnicode_DecodeUTF8(buf, o, NULL);
    PyMem_Free(buf);
    return out;
}

/* The text of the valid string literal b[s:e] as the coalescer keeps it: the bytes between the
 * quotes when they are spelled as orjson spells that text (escapes only among ``\" \\ \b
 * \f \n \r \t``: joined, such literals are orjson's spelling of the joined text), else the
 * decoded str. */
static PyObject *
shape_text(const unsigned char *b, Py_ssize_t s, Py_ssize_t e, int escaped)
{
    for (Py_ssize_t i = s + 1; escaped && i < e - 1; i++) {
        if (b[i] != '\\')
            continue;
        unsigned char x = b[++i];
        if (x != '"' && x != '\\' && x != 'b' && x != 'f' && x != 'n' && x != 'r' && x != 't')
            return shape_decode(b, s, e, escaped);
    }
    return PyBytes_FromStringAndSize((const char *)b + s + 1, e - s - 2);
}

/* A key's bytes (without quotes), for comparisons: k, klen. */
typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
} span_t;

static int
span_is(span_t k, const char *lit)
{
    Py_ssize_t len = (Py_ssize_t)strlen(lit);
    return k.n == len && memcmp(k.p, lit, (size_t)len) == 0;
}

/* One plain object at b[i] == '{' whose keys carry no escape and none twice (else -1), at
 * ``depth``: each member's value is scanned by ``visit`` (key, value start) which returns where
 * the value ends (-1 to refuse). The offset after the object; ``*last_end``: where its last
 * member's value ends (-1: empty). */
typedef Py_ssize_t (*visit_fn)(void *ctx, span_t key, Py_ssize_t vs, Py_ssize_t n, int depth);

static Py_ssize_t
shape_members(const unsigned char *b, Py_ssize_t i, Py_ssize_t n, int depth, visit_fn visit,
              void *ctx, Py_ssize_t *last_end)
{
    if (i >= n || b[i] != '{' || depth >= SHAPE_MAX_DEPTH)
        return -1;
    span_t seen[SHAPE_MAX_FIELDS + 2];
    int count = 0;
    *last_end = -1;
    Py_ssize_t j = ws((const char *)b, i + 1, n);
    if (j < n && b[j] == '}')
        return j + 1;
    for (;;) {
        int escaped = 0, done = 0;
        Py_ssize_t kend = shape_key(b, j, n, &escaped);
        if (kend < 0 || escaped || count > SHAPE_MAX_FIELDS)
            return -1;
        span_t key = {b + j + 1, kend - j - 2};
        for (int k = 0; k < count; k++)
            if (seen[k].n == key.n && same((const char *)seen[k].p, (const char *)key.p, key.n))
                return -1;
        seen[count++] = key;
        Py_ssize_t vs = shape_colon(b, kend, n);
        if (vs < 0)
            return -1;
        Py_ssize_t ve = visit(ctx, key, vs, n, depth + 1);
        if (ve < 0)
            return -1;
        *last_end = ve;
        j = shape_next(b, ve, n, '}', &done);
        if (j < 0)
            return -1;
        if (done)
            return j + 1;
    }
}

/* A string member's value at b[vs]: its end, and its span and escape in ``s``/``e``/``esc``
 * when it is a string (``s`` stays -1 otherwise). */
static Py_ssize_t
shape_string_member(const unsigned char *b, Py_ssize_t vs, Py_ssize_t n, int depth,
                    Py_ssize_t *s, Py_ssize_t *e, int *esc)
{
    if (vs >= n || b[vs] != '"')
        return shape_value(b, vs, n, depth);
    int escaped = 0;
    Py_ssize_t ve = shape_string(b, vs, n, &escaped);
    if (ve >= 0) {
        *s = vs;
        *e = ve;
        *esc = escaped;
    }
    return ve;
}

typedef struct {
    const unsigned char *b;
    int type_ok, other;
    Py_ssize_t text_s, text_e;
    int text_esc;
    const char *want; /* the id one level down */
    Py_ssize_t want_s, want_e;
    int want_esc;
} inner_t;

static Py_ssize_t
visit_content(void *ctx, span_t key, Py_ssize_t vs, Py_ssize_t n, int depth)
{
    inner_t *c = ctx;
    const unsigned char *b = c->b;
    if (span_is(key, "type") && vs + 6 <= n && memcmp(b + vs, "\"text\"", 6) == 0) {
        c->type_ok = 1;
        return vs + 6;
    }
    if (span_is(key, "text") && b[vs] == '"')
        return shape_string_member(b, vs, n, depth, &c->text_s, &c->text_e, &c->text_esc);
    c->other = 1;
    return shape_value(b, vs, n, depth);
}

static Py_ssize_t
visit_inner_id(void *ctx, span_t key, Py_ssize_t vs, Py_ssize_t n, int depth)
{
    inner_t *c = ctx;
    if (span_is(key, c->want))
        return shape_string_member(c->b, vs, n, depth, &c->want_s, &c->want_e, &c->want_esc);
    return shape_value(c->b, vs, n, depth);
}

/* An object member whose keys are looked at (``visit``) when it is plain; else (an escaped or
 * repeated key) it is only validated, and ``*plain`` is 0. */
static Py_ssize_t
shape_inner(const unsigned char *b, Py_ssize_t vs, Py_ssize_t n, int depth, visit_fn visit,
            inner_t *c, int *plain)
{
    Py_ssize_t last;
    Py_ssize_t ve = shape_members(b, vs, n, depth, visit, c, &last);
    *plain = ve >= 0;
    return ve >= 0 ? ve : shape_value(b, vs, n, depth);
}

typedef struct {
    const unsigned char *b;
    PyObject *fields;   /* tuple: bytes, or (bytes, bytes) for an id one level down */
    Py_ssize_t nfields;
    Py_ssize_t nidents; /* the first fields are the entity ids */
    const unsigned char *table; /* the fields by name (``field_of``) */
    Py_ssize_t tlen;
    int kind_field, content_field; /* "sessionUpdate", "content" (-1: not among them) */
    Py_ssize_t sid_s, sid_e;
    int sid_esc;
    Py_ssize_t kind_s, kind_e;
    int kind_esc;
    unsigned long long mask, nulls, objects;
    unsigned char order[SHAPE_MAX_FIELDS + 2];
    int norder;
    int idents; /* ids present */
    Py_ssize_t id_s, id_e;
    int id_esc;
    Py_ssize_t text_s, text_e;
    int text_esc;
    Py_ssize_t ue;
    int jsonrpc, method, params, update;
} shape_t;

/* The index of the field named ``key`` (``fields``' lookup table, ``field_table_py``), or -1.
 * The table: 64 little-endian 16-bit offsets (where the entries of each key length start, and
 * the end at length 63), then the entries, by length: the field's index, then its name. */
static int
field_of(const unsigned char *table, Py_ssize_t tlen, span_t key)
{
    if (key.n >= 63 || tlen < 128)
        return -1;
    Py_ssize_t at = table[2 * key.n] | table[2 * key.n + 1] << 8;
    Py_ssize_t end = table[2 * key.n + 2] | table[2 * key.n + 3] << 8;
    if (end > tlen)
        return -1;
    for (; at + 1 + key.n <= end; at += 1 + key.n)
        if (same((const char *)table + at + 1, (const char *)key.p, key.n))
            return table[at];
    return -1;
}

static Py_ssize_t
visit_update(void *ctx, span_t key, Py_ssize_t vs, Py_ssize_t n, int depth)
{
    shape_t *s = ctx;
    const unsigned char *b = s->b;
    int f = field_of(s->table, s->tlen, key);
    if (f < 0 || f >= s->nfields) {
        s->mask |= 1ull << SHAPE_OTHER_BIT;
        return shape_value(b, vs, n, depth);
    }
    s->mask |= 1ull << f;
    s->order[s->norder++] = (unsigned char)f;
    if (b[vs] == 'n')
        s->nulls |= 1ull << f;
    else if (b[vs] == '{')
        s->objects |= 1ull << f;
    if (f < s->nidents) {
        s->idents++;
        PyObject *field = PyTuple_GET_ITEM(s->fields, f);
        if (!PyTuple_Check(field))
            return shape_string_member(b, vs, n, depth, &s->id_s, &s->id_e, &s->id_esc);
        if (PyTuple_GET_SIZE(field) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(field, 1)))
            return shape_value(b, vs, n, depth); /* (not an id one level down: no id) */
        if (b[vs] != '{')
            return shape_value(b, vs, n, depth);
        inner_t c = {b, 0, 0, -1, -1, 0, PyBytes_AS_STRING(PyTuple_GET_ITEM(field, 1)), -1, -1, 0};
        int plain;
        Py_ssize_t ve = shape_inner(b, vs, n, depth, visit_inner_id, &c, &plain);
        if (plain && c.want_s >= 0) {
            s->id_s = c.want_s;
            s->id_e = c.want_e;
            s->id_esc = c.want_esc;
        }
        return ve;
    }
    if (f == s->kind_field)
        return shape_string_member(b, vs, n, depth, &s->kind_s, &s->kind_e, &s->kind_esc);
    if (f == s->content_field && b[vs] == '{') {
        inner_t c = {b, 0, 0, -1, -1, 0, NULL, -1, -1, 0};
        int plain;
        Py_ssize_t ve = shape_inner(b, vs, n, depth, visit_content, &c, &plain);
        if (plain && c.type_ok && !c.other && c.text_s >= 0) {
            s->text_s = c.text_s;
            s->text_e = c.text_e;
            s->text_esc = c.text_esc;
        }
        return ve;
    }
    return shape_value(b, vs, n, depth);
}

static Py_ssize_t
visit_params(void *ctx, span_t key, Py_ssize_t vs, Py_ssize_t n, int depth)
{
    shape_t *s = ctx;
    const unsigned char *b = s->b;
    if (span_is(key, "sessionId") && b[vs] == '"')
        return shape_string_member(b, vs, n, depth, &s->sid_s, &s->sid_e, &s->sid_esc);
    if (span_is(key, "update") && b[vs] == '{') {
        s->update = 1;
        Py_ssize_t last;
        Py_ssize_t ve = shape_members(b, vs, n, depth, visit_update, s, &last);
        s->ue = last;
        return ve;
    }
    return -1;
}

static Py_ssize_t
visit_top(void *ctx, span_t key, Py_ssize_t vs, Py_ssize_t n, int depth)
{
    shape_t *s = ctx;
    const unsigned char *b = s->b;
    if (span_is(key, "jsonrpc") && vs + 5 <= n && memcmp(b + vs, "\"2.0\"", 5) == 0) {
        s->jsonrpc = 1;
        return vs + 5;
    }
    if (span_is(key, "method") && vs + 16 <= n && memcmp(b + vs, "\"session/update\"", 16) == 0) {
        s->method = 1;
        return vs + 16;
    }
    if (span_is(key, "params") && b[vs] == '{') {
        s->params = 1;
        Py_ssize_t last;
        return shape_members(b, vs, n, depth, visit_params, s, &last);
    }
    return -1;
}

/* The entry of ``kinds`` (a tuple of ``(kind, fast, entity, id_bit, ordered)``) whose kind
 * is spelled exactly ``k`` (its literal's bytes, without the quotes), or NULL. */
static PyObject *
kind_entry(PyObject *kinds, const unsigned char *k, Py_ssize_t klen)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kinds); i++) {
        PyObject *entry = PyTuple_GET_ITEM(kinds, i);
        PyObject *name = PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 5
                             ? PyTuple_GET_ITEM(entry, 0)
                             : NULL;
        if (name == NULL || !PyBytes_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "update_shape: kinds are (bytes, fast, entity, "
                                             "id bit, ordered) tuples");
            return NULL;
        }
        if (PyBytes_GET_SIZE(name) == klen && same(PyBytes_AS_STRING(name), (const char *)k, klen))
            return entry;
    }
    return Py_None; /* (borrowed: no entry) */
}

static PyObject *
update_shape(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[1]) ||
        !PyLong_Check(args[2]) || !PyBytes_Check(args[3]) || !PyTuple_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "update_shape(raw: bytes, fields: tuple, idents: int, "
                                         "table: bytes, kinds: tuple)");
        return NULL;
    }
    shape_t s;
    memset(&s, 0, sizeof(s));
    s.b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    s.fields = args[1];
    s.nfields = PyTuple_GET_SIZE(args[1]);
    s.nidents = PyLong_AsSsize_t(args[2]);
    if (s.nidents == -1 && PyErr_Occurred())
        return NULL;
    if (s.nfields > SHAPE_MAX_FIELDS || s.nidents < 0 || s.nidents > s.nfields) {
        PyErr_SetString(PyExc_ValueError, "update_shape: at most 62 fields, idents among them");
        return NULL;
    }
    s.table = (const unsigned char *)PyBytes_AS_STRING(args[3]);
    s.tlen = PyBytes_GET_SIZE(args[3]);
    {
        span_t kind = {(const unsigned char *)"sessionUpdate", 13};
        span_t content = {(const unsigned char *)"content", 7};
        s.kind_field = field_of(s.table, s.tlen, kind);
        s.content_field = field_of(s.table, s.tlen, content);
    }
    s.id_s = s.text_s = s.sid_s = s.kind_s = -1;
    s.id_e = s.text_e = s.sid_e = s.kind_e = -1;
    s.ue = -1;
    const unsigned char *b = s.b;
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t last;
    Py_ssize_t end = shape_members(b, ws((const char *)b, 0, n), n, 0, visit_top, &s, &last);
    if (end < 0 || ws((const char *)b, end, n) != n || !s.jsonrpc || !s.method || !s.params ||
        !s.update || s.sid_s < 0 || s.kind_s < 0 || s.kind_esc)
        Py_RETURN_NONE;
    PyObject *entry = kind_entry(args[4], b + s.kind_s + 1, s.kind_e - s.kind_s - 2);
    if (entry == NULL)
        return NULL;
    if (entry == Py_None)
        Py_RETURN_NONE;
    long id_bit = PyLong_AsLong(PyTuple_GET_ITEM(entry, 3));
    if (id_bit == -1 && PyErr_Occurred())
        return NULL;
    int keyed = id_bit == 0 || (s.idents == 1 && s.id_s >= 0 && (s.mask & (unsigned long long)id_bit));
    PyObject *out = PyTuple_New(8);
    if (out == NULL)
        return NULL;
    PyObject *item, *sid, *ident;
    /* (each item set as it is made: a failure leaves the tuple to free what was made) */
#define SHAPE_SET(i, make)                                                                    \
    do {                                                                                       \
        item = (make);                                                                         \
        if (item == NULL) {                                                                    \
            Py_DECREF(out);                                                                    \
            return NULL;                                                                       \
        }                                                                                      \
        PyTuple_SET_ITEM(out, (i), item);                                                      \
    } while (0)
    SHAPE_SET(0, Py_NewRef(PyTuple_GET_ITEM(entry, 1)));
    SHAPE_SET(2, s.idents == 1 && s.id_s >= 0 ? shape_decode(b, s.id_s, s.id_e, s.id_esc)
                                               : Py_NewRef(Py_None));
    ident = item;
    sid = shape_decode(b, s.sid_s, s.sid_e, s.sid_esc);
    if (sid == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    if (!keyed)
        item = Py_NewRef(Py_None);
    else if (id_bit == 0)
        item = PyTuple_Pack(2, PyTuple_GET_ITEM(entry, 2), sid);
    else
        item = PyTuple_Pack(3, PyTuple_GET_ITEM(entry, 2), sid, ident);
    Py_DECREF(sid);
    SHAPE_SET(1, item);
    SHAPE_SET(3, PyLong_FromUnsignedLongLong(s.mask));
    SHAPE_SET(4, PyObject_IsTrue(PyTuple_GET_ITEM(entry, 4))
                     ? PyBytes_FromStringAndSize((const char *)s.order, s.norder)
                     : Py_NewRef(Py_None));
    SHAPE_SET(5, s.text_s >= 0 ? shape_text(b, s.text_s, s.text_e, s.text_esc)
                               : Py_NewRef(Py_None));
    SHAPE_SET(6, PyLong_FromUnsignedLongLong(s.nulls));
    SHAPE_SET(7, PyLong_FromUnsignedLongLong(s.objects));
#undef SHAPE_SET
    return out;
}

/* split_lines(raw) -> list[bytes]: ``raw.split(b"\n")`` (its reference), the newlines found
 * with memchr (CPython's split looks at each byte in turn: a third of a merge pass). */
static PyObject *
split_lines(PyObject *self, PyObject *raw)
{
    (void)self;
    if (!PyBytes_Check(raw)) {
        PyErr_SetString(PyExc_TypeError, "split_lines: raw must be bytes");
        return NULL;
    }
    const char *b = PyBytes_AS_STRING(raw);
    Py_ssize_t n = PyBytes_GET_SIZE(raw), start = 0;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (;;) {
        const char *nl = memchr(b + start, '\n', (size_t)(n - start));
        Py_ssize_t stop = nl == NULL ? n : nl - b;
        PyObject *line = PyBytes_FromStringAndSize(b + start, stop - start);
        if (line == NULL || PyList_Append(out, line) < 0) {
            Py_XDECREF(line);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(line);
        if (nl == NULL)
            return out;
        start = stop + 1;
    }
}

static PyMethodDef methods[] = {
    {"contains", (PyCFunction)(void (*)(void))contains_needle, METH_FASTCALL,
     "contains(raw, needle) -> bool: needle in raw (see acp_proxy.wire.raw.block_scan.contains_py)."},
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(raw, needles) -> (lines, specials): see acp_proxy.wire.raw.block_scan.scan_py."},
    {"numbers_risky", (PyCFunction)numbers_risky, METH_O,
     "numbers_risky(raw) -> bool: see acp_proxy.wire.raw._scan.c (rawjson._risky_numbers)."},
    {"splice_member", (PyCFunction)(void (*)(void))splice_member, METH_FASTCALL,
     "splice_member(raw, path, key, member_key, value, expect) -> bytes | None: see _scan.c."},
    {"array_elements", (PyCFunction)(void (*)(void))array_elements, METH_FASTCALL,
     "array_elements(raw, i) -> (spans, close) | None: see rawjson.array_elements."},
    {"update_shape", (PyCFunction)(void (*)(void))update_shape, METH_FASTCALL,
     "update_shape(raw, fields, idents, table, kinds) -> tuple | None: see "
     "acp_proxy.wire.coalesce.shape.update_shape_py."},
    {"split_lines", (PyCFunction)split_lines, METH_O,
     "split_lines(raw) -> list[bytes]: raw.split(b'\\n'), faster."},
    {"member_span", (PyCFunction)(void (*)(void))member_span, METH_FASTCALL,
     "member_span(raw, path, key) -> (start, close, vs, ve, last_end) | None: see "
     "acp_proxy.wire.raw.rawjson.member_span_py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "acp_proxy.wire.raw._scan",
    "The C accelerator of acp_proxy.wire.raw.block_scan (optional; same contract as scan_py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__scan(void)
{
    return PyModule_Create(&module);
}
