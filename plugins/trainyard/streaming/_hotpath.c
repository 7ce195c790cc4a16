/*
 * trainyard.streaming._hotpath: the stream scorer's per-record work in C: a batch's
 * contract checks and model inputs, its score documents and the commit's Redis bulk strings.
 *
 *   check_rows(records, columns, extra_ok, n_features, n_texts)
 *       -> (suspect: bytearray, features: list[bytearray], texts: list[list])
 *   scores_resp(keys, sources, scores, classes, version) -> bytes | None
 *   bulk_strings(texts) -> bytes
 *   stream_reply(data, cls) -> (list, end) | None | False
 *
 * stream_reply reads the XREADGROUP reply (RESP2) at the start of the bytes data, as the
 * socket gave them, into cls(id, value, None, ...) tuples (cls a namedtuple of at least
 * two fields: engines.Message), and where the reply ends. It returns None when data ends
 * before the reply does (read more), and False when the reply is anything but nil or one
 * stream of plain entries, each exactly [id, [b"value", value]] with an ASCII id: an
 * error, keyed and odd entries go to hiredis and the Python path.
 *
 * check_rows over-approximates records.RecordChecker.check: it flags (suspect[i] = 1)
 * every record check() might refuse, and some it accepts (an integer of 2**53 or more,
 * a value of an unexpected Python type), and never passes one it refuses; the caller
 * asks check() about the flagged ones, which words the reason.
 * columns is a tuple per contract column: (name, kind, required, null_ok, lo, lo_excl,
 * hi, hi_excl, allowed, min_len, max_len, feature, text), kind 0 a string, 1 an integer,
 * 2 a number, 3 a bool; lo and hi floats or None (bounds exactly representable as
 * doubles), allowed a frozenset or None (membership as Python's `in`), min_len and
 * max_len -1 for none, feature the column's index among the model's inputs or -1, text
 * its index among the columns whose strings the caller checks itself (a regex) or -1.
 * For each record not flagged, features[k] holds the float32 of feature k (as numpy's
 * float32 of the Python value) and texts[t] the string of text column t (None elsewhere).
 *
 * scores_resp writes, per record i, the two RESP bulk strings of the commit script's
 * "key value" arguments: keys[i] (UTF-8), then the document
 *
 *   {"id":<keys[i]>,"score":<scores[i]>,"class_id":<classes[i] or null>,
 *    "version":<version>,"source":<sources[i]>}
 *
 * byte for byte as engines.encode_scores (and orjson.dumps) writes it: strings escaped as
 * orjson escapes them (", \, the short escapes \b \f \n \r \t, other control characters
 * as \u00xx, everything else verbatim UTF-8), and scores[i] the i-th number of the bytes
 * `scores`, orjson.dumps of the batch's list of floats, copied as it is. It returns None
 * when an argument is not of the types above (lists of str, of int or None; an int
 * version), so the caller falls back to the Python path for anything unusual.
 *
 * bulk_strings writes each text as a RESP bulk string (the entry ids a commit
 * acknowledges).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <string.h>

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
} out_t;

static int reserve(out_t *o, Py_ssize_t more) {
    if (o->len + more <= o->cap) return 0;
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more) cap *= 2;
    char *grown = PyMem_Realloc(o->buf, (size_t)cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->buf = grown;
    o->cap = cap;
    return 0;
}

static inline void put(out_t *o, const char *s, Py_ssize_t n) {
    memcpy(o->buf + o->len, s, (size_t)n);
    o->len += n;
}

static const char HEX[] = "0123456789abcdef";

/* The JSON string literal of s[0:n] (UTF-8) as orjson writes it; o has room for 6n + 2. */
static void put_json_string(out_t *o, const unsigned char *s, Py_ssize_t n) {
    char *w = o->buf + o->len;
    *w++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *w++ = (char)c;
            continue;
        }
        *w++ = '\\';
        switch (c) {
            case '"': *w++ = '"'; break;
            case '\\': *w++ = '\\'; break;
            case '\b': *w++ = 'b'; break;
            case '\f': *w++ = 'f'; break;
            case '\n': *w++ = 'n'; break;
            case '\r': *w++ = 'r'; break;
            case '\t': *w++ = 't'; break;
            default:
                *w++ = 'u';
                *w++ = '0';
                *w++ = '0';
                *w++ = HEX[c >> 4];
                *w++ = HEX[c & 15];
        }
    }
    *w++ = '"';
    o->len = w - o->buf;
}

/* The decimal digits of v (room for 20 characters). */
static inline void put_int(out_t *o, long long v) {
    char digits[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        digits[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) o->buf[o->len++] = '-';
    while (n) o->buf[o->len++] = digits[--n];
}

/* "$<n>\r\n" */
static inline void put_bulk_head(out_t *o, Py_ssize_t n) {
    o->buf[o->len++] = '$';
    put_int(o, n);
    o->buf[o->len++] = '\r';
    o->buf[o->len++] = '\n';
}

static PyObject *finish(out_t *o) {
    PyObject *result = PyBytes_FromStringAndSize(o->buf, o->len);
    PyMem_Free(o->buf);
    return result;
}

static PyObject *scores_resp(PyObject *self, PyObject *args) {
    PyObject *keys, *sources, *classes;
    const char *scores;
    Py_ssize_t scores_len;
    long long version;
    if (!PyArg_ParseTuple(args, "O!O!y#O!L", &PyList_Type, &keys, &PyList_Type, &sources,
                          &scores, &scores_len, &PyList_Type, &classes, &version))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(sources) != n || PyList_GET_SIZE(classes) != n) {
        PyErr_SetString(PyExc_ValueError, "scores_resp: the lists differ in length");
        return NULL;
    }
    /* the scores' JSON array: its numbers (no commas inside any) are copied as they are */
    const char *at = scores + 1, *end = scores + scores_len - 1;
    if (scores_len < 2 || scores[0] != '[' || *end != ']') goto bad_scores;
    char version_text[32];
    int version_len = snprintf(version_text, sizeof version_text, "%lld", version);
    out_t o = {NULL, 0, 0};
    /* the document's value bytes go here first: its length heads its bulk string */
    out_t doc = {NULL, 0, 0};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *src = PyList_GET_ITEM(sources, i);
        PyObject *cls = PyList_GET_ITEM(classes, i);
        const char *comma = memchr(at, ',', (size_t)(end - at));
        const char *score_end = comma ? comma : end;
        Py_ssize_t rlen = score_end - at;
        if (rlen == 0 || (comma == NULL) != (i == n - 1)) {
            PyMem_Free(doc.buf);
            PyMem_Free(o.buf);
            goto bad_scores;
        }
        if (!PyUnicode_CheckExact(key) || !PyUnicode_CheckExact(src) ||
            (cls != Py_None && !PyLong_CheckExact(cls)))
            goto fallback;
        long long c = 0;
        if (cls != Py_None) {
            int overflow;
            c = PyLong_AsLongLongAndOverflow(cls, &overflow);
            if (overflow || (c == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                goto fallback;
            }
        }
        Py_ssize_t klen, slen;
        const char *k = PyUnicode_AsUTF8AndSize(key, &klen);
        const char *sv = k ? PyUnicode_AsUTF8AndSize(src, &slen) : NULL;
        if (sv == NULL) {  /* a lone surrogate: not UTF-8 */
            PyErr_Clear();
            goto fallback;
        }
        doc.len = 0;
        if (reserve(&doc, 6 * (klen + slen) + rlen + version_len + 96) < 0) goto error;
        put(&doc, "{\"id\":", 6);
        put_json_string(&doc, (const unsigned char *)k, klen);
        put(&doc, ",\"score\":", 9);
        put(&doc, at, rlen);
        at = score_end + 1;
        put(&doc, ",\"class_id\":", 12);
        if (cls == Py_None)
            put(&doc, "null", 4);
        else
            put_int(&doc, c);
        put(&doc, ",\"version\":", 11);
        put(&doc, version_text, version_len);
        put(&doc, ",\"source\":", 10);
        put_json_string(&doc, (const unsigned char *)sv, slen);
        put(&doc, "}", 1);
        if (reserve(&o, klen + doc.len + 64) < 0) goto error;
        put_bulk_head(&o, klen);
        put(&o, k, klen);
        put(&o, "\r\n", 2);
        put_bulk_head(&o, doc.len);
        put(&o, doc.buf, doc.len);
        put(&o, "\r\n", 2);
    }
    if (n == 0 && at != end) goto bad_scores;
    PyMem_Free(doc.buf);
    return finish(&o);
bad_scores:
    PyErr_SetString(PyExc_ValueError,
                    "scores_resp: scores must be a JSON array of one number per key");
    return NULL;
fallback:
    PyMem_Free(doc.buf);
    PyMem_Free(o.buf);
    Py_RETURN_NONE;
error:
    PyMem_Free(doc.buf);
    PyMem_Free(o.buf);
    return NULL;
}

static PyObject *bulk_strings(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "bulk_strings: expected a list of str");
        return NULL;
    }
    out_t o = {NULL, 0, 0};
    Py_ssize_t n = PyList_GET_SIZE(arg);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(arg, i);
        if (!PyUnicode_Check(item)) {
            PyMem_Free(o.buf);
            PyErr_SetString(PyExc_TypeError, "bulk_strings: expected a list of str");
            return NULL;
        }
        Py_ssize_t len;
        const char *text = PyUnicode_AsUTF8AndSize(item, &len);
        if (text == NULL || reserve(&o, len + 32) < 0) {
            PyMem_Free(o.buf);
            return NULL;
        }
        put_bulk_head(&o, len);
        put(&o, text, len);
        put(&o, "\r\n", 2);
    }
    return finish(&o);
}

enum { KIND_STRING, KIND_INT, KIND_NUMBER, KIND_BOOL };

#define EXACT_INT_MAX 9007199254740992LL /* 2**53: every integer up to it is a double */

typedef struct {
    PyObject *name, *allowed;
    int kind, required, null_ok, lo_excl, hi_excl, has_lo, has_hi;
    double lo, hi;
    Py_ssize_t min_len, max_len;
    int feature, text;
} column_t;

static int parse_column(PyObject *spec, column_t *c) {
    PyObject *lo, *hi;
    if (!PyArg_ParseTuple(spec, "UippOpOpOnnii;check_rows: a column is (name, kind, required, "
                          "null_ok, lo, lo_excl, hi, hi_excl, allowed, min_len, max_len, "
                          "feature, text)",
                          &c->name, &c->kind, &c->required, &c->null_ok, &lo, &c->lo_excl, &hi,
                          &c->hi_excl, &c->allowed, &c->min_len, &c->max_len, &c->feature,
                          &c->text))
        return -1;
    c->has_lo = lo != Py_None;
    c->has_hi = hi != Py_None;
    c->lo = c->has_lo ? PyFloat_AsDouble(lo) : 0.0;
    c->hi = c->has_hi ? PyFloat_AsDouble(hi) : 0.0;
    if (PyErr_Occurred()) return -1;
    if (c->allowed == Py_None) c->allowed = NULL;
    if (c->allowed != NULL && !PyFrozenSet_Check(c->allowed)) {
        PyErr_SetString(PyExc_TypeError, "check_rows: allowed must be a frozenset or None");
        return -1;
    }
    if (c->kind < KIND_STRING || c->kind > KIND_BOOL) {
        PyErr_SetString(PyExc_ValueError, "check_rows: unknown column kind");
        return -1;
    }
    return 0;
}

/* 1 if v is in the frozenset, 0 if not (or comparing raised: the caller's check decides). */
static inline int member(PyObject *set, PyObject *v) {
    int got = PySet_Contains(set, v);
    if (got < 0) {
        PyErr_Clear();
        return 0;
    }
    return got;
}

/* The value of a number check() accepts for the column's kind, exactly, in *d; 0 if the
 * record must go to check() (another type, not finite, an integer beyond 2**53). */
static inline int number_of(PyObject *v, int kind, double *d) {
    if (kind == KIND_BOOL) {
        if (v != Py_True && v != Py_False) return 0;
        *d = v == Py_True ? 1.0 : 0.0;
        return 1;
    }
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || n > EXACT_INT_MAX || n < -EXACT_INT_MAX) return 0;
        *d = (double)n;
        return 1;
    }
    if (PyFloat_CheckExact(v)) {
        double x = PyFloat_AS_DOUBLE(v);
        if (!isfinite(x) || kind == KIND_INT) return 0; /* a float is no integer */
        *d = x;
        return 1;
    }
    return 0;
}

/* 1 if the column's non-null value v passes (as far as this side checks), else 0. */
static inline int value_passes(const column_t *c, PyObject *v, double *d) {
    if (c->kind == KIND_STRING) {
        if (!PyUnicode_Check(v)) return 0;
        Py_ssize_t n = PyUnicode_GET_LENGTH(v);
        if ((c->min_len >= 0 && n < c->min_len) || (c->max_len >= 0 && n > c->max_len)) return 0;
        return c->allowed == NULL || member(c->allowed, v);
    }
    if (!number_of(v, c->kind, d)) return 0;
    if (c->has_lo && (c->lo_excl ? *d <= c->lo : *d < c->lo)) return 0;
    if (c->has_hi && (c->hi_excl ? *d >= c->hi : *d > c->hi)) return 0;
    return c->allowed == NULL || member(c->allowed, v);
}

static PyObject *check_rows(PyObject *self, PyObject *args) {
    PyObject *records, *specs;
    int extra_ok;
    Py_ssize_t n_features, n_texts;
    if (!PyArg_ParseTuple(args, "O!O!pnn", &PyList_Type, &records, &PyTuple_Type, &specs,
                          &extra_ok, &n_features, &n_texts))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records), n_cols = PyTuple_GET_SIZE(specs);
    column_t *cols = PyMem_Calloc((size_t)(n_cols ? n_cols : 1), sizeof(column_t));
    if (cols == NULL) return PyErr_NoMemory();
    PyObject *suspect = NULL, *features = NULL, *texts = NULL, *result = NULL;
    for (Py_ssize_t k = 0; k < n_cols; k++) {
        if (parse_column(PyTuple_GET_ITEM(specs, k), &cols[k]) < 0) goto done;
        if (cols[k].feature >= n_features || cols[k].text >= n_texts ||
            (cols[k].feature >= 0 && cols[k].kind == KIND_STRING) ||
            (cols[k].text >= 0 && cols[k].kind != KIND_STRING)) {
            PyErr_SetString(PyExc_ValueError, "check_rows: bad feature or text index");
            goto done;
        }
    }
    suspect = PyByteArray_FromStringAndSize(NULL, n);
    features = PyList_New(n_features);
    texts = PyList_New(n_texts);
    if (suspect == NULL || features == NULL || texts == NULL) goto done;
    char *flags = PyByteArray_AS_STRING(suspect);
    memset(flags, 0, (size_t)n);
    float **feature = PyMem_Calloc((size_t)(n_features ? n_features : 1), sizeof(float *));
    if (feature == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t f = 0; f < n_features; f++) {
        PyObject *buf = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(float));
        if (buf == NULL) {
            PyMem_Free(feature);
            goto done;
        }
        PyList_SET_ITEM(features, f, buf);
        feature[f] = (float *)PyByteArray_AS_STRING(buf);
        memset(feature[f], 0, (size_t)n * sizeof(float));
    }
    for (Py_ssize_t t = 0; t < n_texts; t++) {
        PyObject *list = PyList_New(n);
        if (list == NULL) {
            PyMem_Free(feature);
            goto done;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_INCREF(Py_None);
            PyList_SET_ITEM(list, i, Py_None);
        }
        PyList_SET_ITEM(texts, t, list);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        if (!PyDict_CheckExact(r)) {
            flags[i] = 1;
            continue;
        }
        Py_ssize_t present = 0;
        int bad = 0;
        for (Py_ssize_t k = 0; k < n_cols && !bad; k++) {
            const column_t *c = &cols[k];
            PyObject *v = PyDict_GetItemWithError(r, c->name);
            if (v == NULL) {
                if (PyErr_Occurred()) {
                    PyMem_Free(feature);
                    goto done;
                }
                bad = c->required;
                continue;
            }
            present++;
            if (v == Py_None) {
                bad = !c->null_ok;
                continue;
            }
            double d = 0.0;
            if (!value_passes(c, v, &d)) {
                bad = 1;
                continue;
            }
            /* beyond float32 becomes inf, as numpy makes it: the scorer dead-letters it */
            if (c->feature >= 0) feature[c->feature][i] = (float)d;
            if (c->text >= 0) {
                PyObject *list = PyList_GET_ITEM(texts, c->text);
                PyObject *old = PyList_GET_ITEM(list, i);
                Py_INCREF(v);
                PyList_SET_ITEM(list, i, v);
                Py_DECREF(old);
            }
        }
        if (!bad && !extra_ok && present != PyDict_GET_SIZE(r)) bad = 1;
        flags[i] = (char)bad;
    }
    PyMem_Free(feature);
    result = PyTuple_Pack(3, suspect, features, texts);
done:
    PyMem_Free(cols);
    Py_XDECREF(suspect);
    Py_XDECREF(features);
    Py_XDECREF(texts);
    return result;
}

/* stream_reply's RESP2 reader: pos moves through d[0:len]. */
typedef struct {
    const char *d;
    Py_ssize_t len, pos;
} resp_t;

enum { RESP_DONE = 0, RESP_MORE = 1, RESP_ODD = 2 };

/* "<c><digits>\r\n", its number in *n: RESP_MORE when the bytes end first, RESP_ODD when
 * they are something else. */
static int resp_head(resp_t *r, char c, Py_ssize_t *n) {
    if (r->pos >= r->len) return RESP_MORE;
    if (r->d[r->pos] != c) return RESP_ODD;
    Py_ssize_t p = r->pos + 1, v = 0;
    for (; p < r->len && r->d[p] >= '0' && r->d[p] <= '9'; p++) {
        if (p - r->pos > 15) return RESP_ODD;
        v = v * 10 + (r->d[p] - '0');
    }
    if (p + 1 >= r->len) return RESP_MORE;
    if (p == r->pos + 1 || r->d[p] != '\r' || r->d[p + 1] != '\n') return RESP_ODD;
    r->pos = p + 2;
    *n = v;
    return RESP_DONE;
}

/* "$<n>\r\n<n bytes>\r\n": where its bytes start, and n. */
static int resp_bulk(resp_t *r, Py_ssize_t *start, Py_ssize_t *n) {
    int st = resp_head(r, '$', n);
    if (st != RESP_DONE) return st;
    if (r->len - r->pos < *n + 2) return RESP_MORE;
    if (r->d[r->pos + *n] != '\r' || r->d[r->pos + *n + 1] != '\n') return RESP_ODD;
    *start = r->pos;
    r->pos += *n + 2;
    return RESP_DONE;
}

#define TAKE(call)                      \
    do {                                \
        int st_ = (call);               \
        if (st_ != RESP_DONE) return st_;    \
    } while (0)
#define WANT(cond) \
    if (!(cond)) return RESP_ODD

/* One XREADGROUP reply of plain entries: [[stream, [[id, [b"value", value]], ...]]].
 * With out NULL it only reads (the entries' count in *count); otherwise it fills out. */
static int stream_walk(resp_t *r, Py_ssize_t *count, PyObject *out, PyTypeObject *cls,
                       Py_ssize_t size) {
    Py_ssize_t n, s;
    TAKE(resp_head(r, '*', &n));
    WANT(n == 1);
    TAKE(resp_head(r, '*', &n));
    WANT(n == 2);
    TAKE(resp_bulk(r, &s, &n)); /* the stream's name */
    TAKE(resp_head(r, '*', count));
    for (Py_ssize_t i = 0; i < *count; i++) {
        Py_ssize_t id_at, id_n, v_at, v_n;
        TAKE(resp_head(r, '*', &n));
        WANT(n == 2);
        TAKE(resp_bulk(r, &id_at, &id_n));
        for (Py_ssize_t k = 0; k < id_n; k++) WANT((unsigned char)r->d[id_at + k] < 0x80);
        TAKE(resp_head(r, '*', &n));
        WANT(n == 2);
        TAKE(resp_bulk(r, &s, &n));
        WANT(n == 5 && memcmp(r->d + s, "value", 5) == 0);
        TAKE(resp_bulk(r, &v_at, &v_n));
        if (out == NULL) continue;
        PyObject *id = PyUnicode_DecodeASCII(r->d + id_at, id_n, "strict");
        PyObject *value = PyBytes_FromStringAndSize(r->d + v_at, v_n);
        /* as tuple.__new__(cls, ...) makes one: the namedtuple's own __new__ adds nothing */
        PyObject *m = (id && value) ? cls->tp_alloc(cls, size) : NULL;
        if (m == NULL) {
            Py_XDECREF(id);
            Py_XDECREF(value);
            return -1;
        }
        PyTuple_SET_ITEM(m, 0, id);
        PyTuple_SET_ITEM(m, 1, value);
        for (Py_ssize_t k = 2; k < size; k++) {
            Py_INCREF(Py_None);
            PyTuple_SET_ITEM(m, k, Py_None);
        }
        PyList_SET_ITEM(out, i, m);
    }
    return RESP_DONE;
}

static PyObject *stream_reply(PyObject *self, PyObject *args) {
    Py_buffer buf;
    PyTypeObject *cls;
    if (!PyArg_ParseTuple(args, "y*O!", &buf, &PyType_Type, &cls)) return NULL;
    PyObject *result = NULL, *out = NULL;
    if (!PyType_IsSubtype(cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "stream_reply: cls must be a tuple subclass");
        goto done;
    }
    PyObject *names = PyObject_GetAttrString((PyObject *)cls, "_fields");
    Py_ssize_t size = names == NULL ? -1 : PyObject_Length(names);
    Py_XDECREF(names);
    if (size < 2) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "stream_reply: cls must have at least two fields");
        goto done;
    }
    static const char NIL[] = "*-1\r\n"; /* BLOCK ran out: nothing new */
    Py_ssize_t head = buf.len < 5 ? buf.len : 5;
    if (memcmp(buf.buf, NIL, head) == 0) {
        if (head < 5) result = Py_NewRef(Py_None);
        else if ((out = PyList_New(0)) != NULL) result = Py_BuildValue("(On)", out, (Py_ssize_t)5);
        goto done;
    }
    resp_t r = {buf.buf, buf.len, 0};
    Py_ssize_t count = 0;
    int st = stream_walk(&r, &count, NULL, cls, size);
    if (st != RESP_DONE) {
        result = Py_NewRef(st == RESP_MORE ? Py_None : Py_False);
        goto done;
    }
    Py_ssize_t end = r.pos;
    if ((out = PyList_New(count)) == NULL) goto done;
    r.pos = 0;
    if (stream_walk(&r, &count, out, cls, size) != RESP_DONE) goto done;
    result = Py_BuildValue("(On)", out, end);
done:
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef METHODS[] = {
    {"stream_reply", stream_reply, METH_VARARGS,
     "stream_reply(data, cls) -> (list, end) | None | False: the XREADGROUP reply at the "
     "start of data, its plain entries as cls(id, value, None, ...); None when data ends "
     "first, False when the reply is anything else."},
    {"check_rows", check_rows, METH_VARARGS,
     "check_rows(records, columns, extra_ok, n_features, n_texts) -> (suspect, features, "
     "texts): a batch's contract checks (flagging what check() must decide) and its model "
     "inputs as float32."},
    {"scores_resp", scores_resp, METH_VARARGS,
     "scores_resp(keys, sources, scores, classes, version) -> bytes | None: each record's "
     "key and score document as RESP bulk strings; None when the Python path must decide."},
    {"bulk_strings", bulk_strings, METH_O,
     "bulk_strings(texts) -> bytes: each text (UTF-8) as a RESP bulk string."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "trainyard.streaming._hotpath",
    "The stream scorer's per-record work: contract checks, model inputs, commit packing.", -1,
    METHODS,
};

PyMODINIT_FUNC PyInit__hotpath(void) { return PyModule_Create(&MODULE); }
