/*
 * trainyard.serving._decode: predict request bodies of float32 rows, parsed in one pass.
 *
 *   float32_rows(body, start, end, row_shape) -> (bytes, rows) | None
 *
 * body[start:end] must be a JSON array of rows, each a nested array of numbers of exactly
 * row_shape (e.g. [[[[0.5], ...], ...], ...] for (8, 8, 1)). The result is every number as
 * float32, C order, bit-identical to what the json path gives (float(text), then float32):
 * a number is converted exactly when Clinger's fast path applies, else in double arithmetic
 * whose few ulps of error cannot change the float32 unless the value lies next to a float32
 * rounding boundary, and those few go through CPython's correctly rounded strtod. Anything
 * else (bad JSON, other shape, integers of 2**53 or more, values beyond float32) returns
 * None, and the json path decides and words the error.
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

static PyMethodDef methods[] = {
    {"float32_rows", float32_rows, METH_VARARGS, float32_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_decode",
    "Predict request bodies of float32 rows parsed in C, bit-identical to the json path.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__decode(void) {
    for (int k = 0; k < 23; k++) INV_P10[k] = 1.0 / P10[k];
    return PyModule_Create(&module);
}
