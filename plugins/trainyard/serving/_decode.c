/*
 * trainyard.serving._decode: predict request bodies of float32 rows, parsed in one pass,
 * and float32 outputs printed as TF Serving prints them.
 *
 *   float32_rows(body, start, end, row_shape) -> (bytes, rows) | None
 *   float32_json(data, shape) -> bytes | None
 *
 * body[start:end] must be a JSON array of rows, each a nested array of numbers of exactly
 * row_shape (e.g. [[[[0.5], ...], ...], ...] for (8, 8, 1)). The result is every number as
 * float32, C order, bit-identical to what the json path gives (float(text), then float32):
 * a number is converted exactly when Clinger's fast path applies, else in double arithmetic
 * whose few ulps of error cannot change the float32 unless the value lies next to a float32
 * rounding boundary, and those few go through CPython's correctly rounded strtod. Anything
 * else (bad JSON, other shape, integers of 2**53 or more, values beyond float32) returns
 * None, and the json path decides and words the error.
 *
 * float32_json prints a C-order float32 buffer of the given shape as nested JSON arrays,
 * each number as TF Serving's json_tensor.cc WriteDecimal does: printf "%g" (six
 * significant digits) if that reads back as the same float32, else "%.9g"; ".0" appended
 * to a whole number without an exponent; NaN, Infinity, -Infinity. For 2**-100 <= |x| <
 * 2**24 the digits and the read-back test are exact 128-bit integer arithmetic on the
 * float's mantissa and exponent; other values, and a six-digit text that falls exactly
 * on a rounding midpoint, take snprintf and strtof: the definition above, verbatim.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIMS 16

typedef struct {
    Py_ssize_t at, len, index;
} slow_t;

typedef struct {
    const unsigned char *p, *end;
    const Py_ssize_t *dims;  /* row shape */
    int ndims;
    float *out;
    Py_ssize_t n, cap;
    slow_t *slow;
    Py_ssize_t n_slow, cap_slow;
    const unsigned char *base;
} parser_t;

static const double P10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                             1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                             1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
static double INV_P10[23];

static inline void skip_ws(parser_t *ps) {
    const unsigned char *p = ps->p;
    while (p < ps->end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    ps->p = p;
}

#define DIGIT(c) ((unsigned)((c) - '0') < 10u)

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SWAR 1
/* Eight ASCII digits at once (as fast_float does): test, then value. */
static inline uint64_t load8(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline int eight_digits(uint64_t v) {
    return ((v & 0xF0F0F0F0F0F0F0F0ULL) |
            (((v + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) >> 4)) ==
           0x3333333333333333ULL;
}

static inline uint64_t eight_digits_value(uint64_t v) {
    const uint64_t mask = 0x000000FF000000FFULL;
    const uint64_t mul1 = 0x000F424000000064ULL; /* 100 + (1000000 << 32) */
    const uint64_t mul2 = 0x0000271000000001ULL; /* 1 + (10000 << 32) */
    v -= 0x3030303030303030ULL;
    v = (v * 10) + (v >> 8);
    return (((v & mask) * mul1) + (((v >> 16) & mask) * mul2)) >> 32;
}
#else
#define SWAR 0
#endif

/* One JSON number into ps->out[ps->n]. Returns 0, or -1 for anything the json path must see.
   The body is NUL-terminated past ps->end (a bytes object), so a digit test can never run
   off the end: NUL is not a digit. */
static int number(parser_t *ps) {
    const unsigned char *p = ps->p, *start = p;
    int neg = 0, is_int = 1, nd = 0, exact = 1;
    uint64_t w = 0;
    long e10 = 0;
    if (*p == '-') { neg = 1; p++; }
    if (!DIGIT(*p)) return -1;
    if (*p == '0') {
        p++;
        if (DIGIT(*p)) return -1;  /* "05" is not JSON */
    } else {
        while (DIGIT(*p)) {
            if (nd < 19) { w = w * 10 + (uint64_t)(*p - '0'); nd++; }
            else { e10++; exact = 0; if (*p != '0') nd = 99; }
            p++;
        }
    }
    if (*p == '.') {
        is_int = 0;
        p++;
        if (!DIGIT(*p)) return -1;
        while (*p == '0' && w == 0) { e10--; p++; }
#if SWAR
        while (nd <= 11 && p + 8 <= ps->end && eight_digits(load8(p))) {
            w = w * 100000000ULL + eight_digits_value(load8(p));
            nd += 8;
            e10 -= 8;
            p += 8;
        }
#endif
        while (DIGIT(*p)) {
            if (nd < 19) { w = w * 10 + (uint64_t)(*p - '0'); nd++; e10--; }
            else if (*p != '0') nd = 99;
            p++;
        }
    }
    if ((*p | 0x20) == 'e') {
        is_int = 0;
        p++;
        int eneg = 0;
        if (*p == '+' || *p == '-') { eneg = *p == '-'; p++; }
        if (!DIGIT(*p)) return -1;
        long ex = 0;
        while (DIGIT(*p)) {
            if (ex < 100000) ex = ex * 10 + (*p - '0');
            else nd = 99;  /* an exponent this long: Python's float() decides */
            p++;
        }
        e10 += eneg ? -ex : ex;
    }
    if (p > ps->end) return -1;
    ps->p = p;
    if (ps->n >= ps->cap) return -1;
    Py_ssize_t index = ps->n++;
    if (is_int) {
        /* json reads an integer: exact below 2**53 ("-0" is the integer 0, so +0.0) */
        if (!exact || nd > 16 || w >= (1ULL << 53)) return -1;
        double d = (double)w;
        ps->out[index] = (float)(neg && w ? -d : d);
        return 0;
    }
    if (w == 0 && nd <= 19) {
        ps->out[index] = neg ? -0.0f : 0.0f;
        return 0;
    }
    double d;
    int sure = 0;
    if (nd <= 19 && w <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        /* Clinger: both operands exact, one correctly rounded operation */
        d = e10 < 0 ? (double)w / P10[-e10] : (double)w * P10[e10];
        sure = 1;
    } else if (nd <= 19 && e10 >= -22 && e10 <= 22) {
        /* w rounded to double, times an exact power or its rounded inverse: within 2 ulps */
        d = e10 < 0 ? (double)w * INV_P10[-e10] : (double)w * P10[e10];
    } else {
        d = NAN;  /* too many digits or too far out: the slow path */
    }
    if (neg) d = -d;
    if (!isnan(d)) {
        float f = (float)d;
        if (isinf(f)) return -1;
        if (!sure && f != 0.0f) {
            /* sure unless a float32 rounding boundary (halfway to a neighbour) is that close */
            uint32_t bits;
            memcpy(&bits, &f, 4);
            uint32_t up_bits = bits + 1, down_bits = bits - 1;
            float up, down;
            memcpy(&up, &up_bits, 4);
            memcpy(&down, &down_bits, 4);
            double margin = fabs(d) * 0x1p-49;
            double hi = ((double)f + (double)up) / 2, lo = ((double)f + (double)down) / 2;
            if (hi < lo) { double t = hi; hi = lo; lo = t; }
            sure = isfinite(up) && isfinite(down) && d + margin < hi && d - margin > lo;
        }
        if (sure) {
            ps->out[index] = f;
            return 0;
        }
    }
    if (ps->n_slow == ps->cap_slow) {
        Py_ssize_t cap = ps->cap_slow ? 2 * ps->cap_slow : 16;
        slow_t *s = realloc(ps->slow, (size_t)cap * sizeof(slow_t));
        if (!s) return -1;
        ps->slow = s;
        ps->cap_slow = cap;
    }
    ps->slow[ps->n_slow++] = (slow_t){start - ps->base, ps->p - start, index};
    return 0;
}

/* An array of dims[level:] ("[" ... "]"), numbers at the last level. */
static int array(parser_t *ps, int level) {
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '[') return -1;
    ps->p++;
    Py_ssize_t want = ps->dims[level];
    for (Py_ssize_t i = 0; i < want; i++) {
        if (i) {
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ',') return -1;
            ps->p++;
        }
        if (level + 1 < ps->ndims) {
            if (array(ps, level + 1) != 0) return -1;
        } else {
            skip_ws(ps);
            if (number(ps) != 0) return -1;
        }
    }
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != ']') return -1;
    ps->p++;
    return 0;
}

/* The outer array of rows. Returns the row count, or -1. */
static Py_ssize_t rows_of(parser_t *ps) {
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '[') return -1;
    ps->p++;
    Py_ssize_t rows = 0;
    for (;;) {
        if (rows) {
            skip_ws(ps);
            if (ps->p >= ps->end) return -1;
            if (*ps->p == ']') break;
            if (*ps->p != ',') return -1;
            ps->p++;
        }
        if (ps->ndims == 0) {
            skip_ws(ps);
            if (number(ps) != 0) return -1;
        } else if (array(ps, 0) != 0) {
            return -1;
        }
        rows++;
    }
    ps->p++;
    skip_ws(ps);
    return ps->p == ps->end ? rows : -1;
}

PyDoc_STRVAR(float32_rows_doc,
"float32_rows(body, start, end, row_shape) -> (bytes, rows) | None\n\n"
"Parse body[start:end], a JSON array of rows of row_shape numbers, as float32 (C order),\n"
"exactly as float(text) then float32; None when the json path must decide.");

static PyObject *float32_rows(PyObject *self, PyObject *args) {
    PyObject *body_obj, *shape_obj;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "SnnO", &body_obj, &start, &end, &shape_obj)) return NULL;
    /* a bytes object: NUL-terminated, which the number parser relies on */
    Py_buffer body;
    if (PyObject_GetBuffer(body_obj, &body, PyBUF_SIMPLE) != 0) return NULL;
    PyObject *result = NULL;
    parser_t ps;
    memset(&ps, 0, sizeof(ps));
    Py_ssize_t dims[MAX_DIMS], per_row = 1;
    PyObject *shape = PySequence_Fast(shape_obj, "row_shape must be a sequence");
    if (!shape) goto done;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(shape);
    if (nd > MAX_DIMS) { Py_DECREF(shape); PyBuffer_Release(&body); Py_RETURN_NONE; }
    for (Py_ssize_t k = 0; k < nd; k++) {
        dims[k] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(shape, k));
        if (dims[k] == -1 && PyErr_Occurred()) { Py_DECREF(shape); goto done; }
        if (dims[k] <= 0) { Py_DECREF(shape); PyBuffer_Release(&body); Py_RETURN_NONE; }
        per_row *= dims[k];
    }
    Py_DECREF(shape);
    if (start < 0 || end > body.len || start > end) {
        PyErr_SetString(PyExc_ValueError, "float32_rows: start/end out of range");
        goto done;
    }
    ps.base = body.buf;
    ps.p = ps.base + start;
    ps.end = ps.base + end;
    ps.dims = dims;
    ps.ndims = (int)nd;
    /* every number takes at least two bytes ("0,") */
    ps.cap = (end - start) / 2 + 1;
    ps.out = malloc((size_t)ps.cap * sizeof(float));
    if (!ps.out) { PyErr_NoMemory(); goto done; }
    Py_ssize_t rows;
    Py_BEGIN_ALLOW_THREADS
    rows = rows_of(&ps);
    Py_END_ALLOW_THREADS
    if (rows <= 0 || ps.n != rows * per_row) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    for (Py_ssize_t k = 0; k < ps.n_slow; k++) {
        slow_t *s = &ps.slow[k];
        char text[64];
        if (s->len >= (Py_ssize_t)sizeof(text)) { result = Py_NewRef(Py_None); goto done; }
        memcpy(text, ps.base + s->at, (size_t)s->len);
        text[s->len] = 0;
        double d = PyOS_string_to_double(text, NULL, NULL);
        if (d == -1.0 && PyErr_Occurred()) { PyErr_Clear(); result = Py_NewRef(Py_None); goto done; }
        float f = (float)d;
        if (!isfinite(f)) { result = Py_NewRef(Py_None); goto done; }
        ps.out[s->index] = f;
    }
    PyObject *data = PyBytes_FromStringAndSize((const char *)ps.out, ps.n * (Py_ssize_t)sizeof(float));
    if (data) {
        result = Py_BuildValue("(Nn)", data, rows);
    }
done:
    free(ps.out);
    free(ps.slow);
    PyBuffer_Release(&body);
    return result;
}

/* ---- float32 outputs as TF Serving prints them ------------------------------------- */

typedef unsigned __int128 u128;

static u128 U10[40];  /* exact powers of ten */

/* TF Serving's text by definition: "%g", read back with strtof, else "%.9g"; + ".0" */
static int tf_text_slow(float f, char *out) {
    int n = snprintf(out, 40, "%g", (double)f);
    if (strtof(out, NULL) != f) n = snprintf(out, 40, "%.9g", (double)f);
    if (!memchr(out, '.', (size_t)n) && !memchr(out, 'e', (size_t)n)) {
        memcpy(out + n, ".0", 3);
        n += 2;
    }
    return n;
}

/* printf "%.{prec}g" of digits n (prec digits, n in [10**(prec-1), 10**prec)) x 10**(x-prec+1) */
static int format_g(int neg, uint64_t n, int prec, int x, char *out) {
    static const char PAIRS[] =
        "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
        "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
        "8081828384858687888990919293949596979899";
    char digits[24];
    int len = prec, k = prec;
    while (k >= 2) {
        memcpy(digits + k - 2, PAIRS + 2 * (n % 100), 2);
        n /= 100;
        k -= 2;
    }
    if (k) digits[0] = (char)('0' + n);
    while (len > 1 && digits[len - 1] == '0') len--;
    char *o = out;
    if (neg) *o++ = '-';
    if (x < -4 || x >= prec) {
        *o++ = digits[0];
        if (len > 1) { *o++ = '.'; memcpy(o, digits + 1, (size_t)len - 1); o += len - 1; }
        *o++ = 'e';
        *o++ = x < 0 ? '-' : '+';
        int ax = x < 0 ? -x : x;
        if (ax >= 100) *o++ = (char)('0' + ax / 100);
        *o++ = (char)('0' + (ax / 10) % 10);
        *o++ = (char)('0' + ax % 10);
    } else if (x >= 0) {
        if (len <= x + 1) {
            memcpy(o, digits, (size_t)len); o += len;
            for (int k = len; k <= x; k++) *o++ = '0';
            *o++ = '.'; *o++ = '0';  /* a whole number: TF Serving appends ".0" */
        } else {
            memcpy(o, digits, (size_t)x + 1); o += x + 1;
            *o++ = '.';
            memcpy(o, digits + x + 1, (size_t)(len - x - 1)); o += len - x - 1;
        }
    } else {
        *o++ = '0'; *o++ = '.';
        for (int k = 0; k < -x - 1; k++) *o++ = '0';
        memcpy(o, digits, (size_t)len); o += len;
    }
    *o = 0;
    return (int)(o - out);
}

/*
 * m * 2**-k (k > 0) rounded to prec significant digits, exactly, ties to even as printf:
 * the digits, and in *x the decimal exponent of the first. 0 when out of the exact range.
 */
static uint64_t round_digits(uint64_t m, int k, int prec, int *x) {
    for (int tries = 0; tries < 3; tries++) {
        int s = prec - 1 - *x;
        if (s > 30 || s < -2) return 0;
        u128 num = (u128)m * U10[s > 0 ? s : 0], q, r, half;
        if (s >= 0) {
            q = num >> k;
            r = num & (((u128)1 << k) - 1);
            half = (u128)1 << (k - 1);
        } else {
            u128 den = U10[-s] << k;
            q = num / den;
            r = num % den;
            half = den / 2;  /* den is even */
        }
        if (q < U10[prec - 1]) { (*x)--; continue; }
        if (q >= U10[prec]) { (*x)++; continue; }
        if (r > half || (r == half && (q & 1))) q++;
        if (q == U10[prec]) { q = U10[prec - 1]; (*x)++; }
        return (uint64_t)q;
    }
    return 0;
}

/*
 * Whether n (prec digits, exponent x) reads back as m * 2**-k: strictly between the
 * midpoints to its neighbours (the lower one is a quarter ulp away at a power of two).
 * -1 when n is on a midpoint (the slow path decides).
 */
static int reads_back(uint64_t n, int prec, int x, uint64_t m, int k) {
    int s = prec - 1 - x;  /* value = n * 10**-s; midpoints (2m +- 1) * 2**-(k+1) */
    u128 lhs, hi, lo;
    if (s >= 0) {
        lhs = (u128)n << (k + 2);
        hi = ((u128)(2 * m + 1) * U10[s]) << 1;
        lo = m == (1u << 23) ? (u128)(4 * m - 1) * U10[s] : ((u128)(2 * m - 1) * U10[s]) << 1;
    } else {
        lhs = ((u128)n * U10[-s]) << (k + 2);
        hi = (u128)(2 * m + 1) << 1;
        lo = m == (1u << 23) ? (u128)(4 * m - 1) : (u128)(2 * m - 1) << 1;
    }
    if (lhs == hi || lhs == lo) return -1;
    return lhs > lo && lhs < hi;
}

static int tf_text(float f, char *out) {
    if (isnan(f)) { memcpy(out, "NaN", 4); return 3; }
    if (isinf(f)) {
        if (f < 0) { memcpy(out, "-Infinity", 10); return 9; }
        memcpy(out, "Infinity", 9); return 8;
    }
    if (f == 0) {
        if (signbit(f)) { memcpy(out, "-0.0", 5); return 4; }
        memcpy(out, "0.0", 4); return 3;
    }
    uint32_t bits;
    memcpy(&bits, &f, 4);
    int neg = (int)(bits >> 31), biased = (int)((bits >> 23) & 0xff);
    /* |f| = m * 2**-k with m in [2**23, 2**24); the exact path covers 2**-100 <= |f| < 2**24 */
    uint64_t m = (bits & 0x7fffff) | (1u << 23);
    int k = 150 - biased;
    if (biased == 0 || k <= 0 || k > 123) return tf_text_slow(f, out);
    /* floor(log10(2**e)) for e = biased - 127 (1233/4096 ~ log10 2); the first digit's
       exponent is that or one more, which round_digits settles */
    int e2 = biased - 127;
    int x = e2 >= 0 ? (e2 * 1233) >> 12 : -((-e2 * 1233 + 4095) >> 12);
    int x6 = x;
    uint64_t n6 = round_digits(m, k, 6, &x6);
    if (n6 == 0) return tf_text_slow(f, out);
    int back = reads_back(n6, 6, x6, m, k);
    if (back < 0) return tf_text_slow(f, out);
    if (back) return format_g(neg, n6, 6, x6, out);
    int x9 = x;
    uint64_t n9 = round_digits(m, k, 9, &x9);
    if (n9 == 0) return tf_text_slow(f, out);
    return format_g(neg, n9, 9, x9, out);
}

PyDoc_STRVAR(float32_json_doc,
"float32_json(data, shape) -> bytes | None\n\n"
"A C-order float32 buffer of the given shape as nested JSON arrays, each number printed\n"
"as TF Serving prints it (%g, else %.9g; .0 on whole numbers; NaN, Infinity); None for\n"
"an empty shape.");

static PyObject *float32_json(PyObject *self, PyObject *args) {
    PyObject *data_obj, *shape_obj;
    if (!PyArg_ParseTuple(args, "OO", &data_obj, &shape_obj)) return NULL;
    Py_ssize_t dims[MAX_DIMS], total = 1;
    PyObject *shape = PySequence_Fast(shape_obj, "shape must be a sequence");
    if (!shape) return NULL;
    Py_ssize_t nd = PySequence_Fast_GET_SIZE(shape);
    if (nd < 1 || nd > MAX_DIMS) {
        Py_DECREF(shape);
        PyErr_SetString(PyExc_ValueError, "float32_json: 1 to 16 dimensions");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < nd; k++) {
        dims[k] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(shape, k));
        if (dims[k] < 0) {
            Py_DECREF(shape);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "float32_json: bad shape");
            return NULL;
        }
        total *= dims[k];
    }
    Py_DECREF(shape);
    if (total == 0) Py_RETURN_NONE;  /* an empty array: the caller prints its brackets */
    Py_buffer buf;
    if (PyObject_GetBuffer(data_obj, &buf, PyBUF_C_CONTIGUOUS) != 0) return NULL;
    if (buf.len != total * (Py_ssize_t)sizeof(float)) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "float32_json: buffer size does not match shape");
        return NULL;
    }
    /* a number takes at most 16 bytes and a comma; brackets: at most 2 per innermost row+1 */
    Py_ssize_t inner = dims[nd - 1] ? dims[nd - 1] : 1;
    Py_ssize_t cap = total * 17 + (total / inner + 2) * 2 * nd + 16;
    char *out = malloc((size_t)cap);
    if (!out) { PyBuffer_Release(&buf); return PyErr_NoMemory(); }
    const float *v = buf.buf;
    char *o = out;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t idx[MAX_DIMS] = {0};
    for (int k = 0; k < nd; k++) *o++ = '[';
    for (Py_ssize_t i = 0; i < total; i++) {
        o += tf_text(v[i], o);
        int k = (int)nd - 1;
        while (k >= 0 && ++idx[k] == dims[k]) { idx[k] = 0; *o++ = ']'; k--; }
        if (k >= 0) {
            *o++ = ',';
            for (int j = k + 1; j < nd; j++) *o++ = '[';
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    PyObject *result = PyBytes_FromStringAndSize(out, o - out);
    free(out);
    return result;
}

static PyMethodDef methods[] = {
    {"float32_rows", float32_rows, METH_VARARGS, float32_rows_doc},
    {"float32_json", float32_json, METH_VARARGS, float32_json_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_decode",
    "Predict request bodies of float32 rows parsed in C, bit-identical to the json path; "
    "float32 outputs printed as TF Serving prints them.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__decode(void) {
    for (int k = 0; k < 23; k++) INV_P10[k] = 1.0 / P10[k];
    U10[0] = 1;
    for (int k = 1; k < 40; k++) U10[k] = U10[k - 1] * 10;
    return PyModule_Create(&module);
}
