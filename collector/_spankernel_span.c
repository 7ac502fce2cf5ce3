/* The span walk of the span kernel: one encoded Span -> one row, or "Python's" (fallback).
 *
 * Mirrors collector/decode_spans.py _span_row for the spans it takes: lowercase hex ids,
 * time bounds, texts cut to max_value_bytes / max_name_bytes on a character boundary (each
 * cut counted in `truncated`), promoted gen_ai.* attributes in their typed columns and the
 * rest through Python's own _attributes_json (its cache and max_attributes rule). A span
 * that would be rejected, or that holds anything else, is returned by its bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#include "_spankernel.h"

/* Attributes one span may carry on the kernel's path. */
#define MAX_ATTRS 256
/* AnyValue field tags of the plain shape (collector/lite_spans.py). */
#define TAG_STRING 0x0A
#define TAG_BOOL 0x10
#define TAG_INT 0x18
#define TAG_DOUBLE 0x21

static PyObject *hex(const uint8_t *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    PyObject *s = PyUnicode_New((Py_ssize_t)(2 * n), 127);
    if (s == NULL)
        return NULL;
    Py_UCS1 *d = PyUnicode_1BYTE_DATA(s);
    for (size_t i = 0; i < n; i++) {
        d[2 * i] = (Py_UCS1)digits[p[i] >> 4];
        d[2 * i + 1] = (Py_UCS1)digits[p[i] & 15];
    }
    return s;
}

static int nonzero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 1;
    return 0;
}

/* UTF-8 text cut to `limit` bytes as Limits._cut does (a cut counts in truncated). */
static int text(SkScope *sc, SkText *memo, const uint8_t *p, size_t n, size_t limit,
                PyObject **out)
{
    if (memo->obj != NULL && memo->n == n && memcmp(memo->p, p, n) == 0) {
        sc->truncated += memo->cut;
        *out = Py_NewRef(memo->obj);
        return DONE;
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)n, NULL);
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return ERROR;
        PyErr_Clear(); /* Python's path names the error */
        return FALLBACK;
    }
    int cut = n > limit;
    if (cut) {
        Py_DECREF(s);
        s = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)sk_utf8_cut(p, n, limit), NULL);
        if (s == NULL)
            return ERROR;
    }
    Py_XSETREF(memo->obj, Py_NewRef(s));
    memo->p = p;
    memo->n = n;
    memo->cut = cut;
    sc->truncated += cut;
    *out = s;
    return DONE;
}

static int promoted_slot(const uint8_t *key, size_t n)
{
    for (int i = 0; i < sk_config.promoted; i++)
        if (sk_config.key_len[i] == n && memcmp(sk_config.keys[i], key, n) == 0)
            return i;
    return -1;
}

/* Python's _attributes_json(rest, True, limits) -> (json, dropped, truncated), remembered
 * per call by the attributes' bytes (the same key as Python's own cache). */
static int rest_json(SkScope *sc, const uint8_t **rp, const size_t *rn, int nrest,
                     PyObject **result)
{
    char joined[2048];
    size_t total = 0;
    PyObject *key = NULL;
    for (int i = 0; i < nrest; i++)
        total += rn[i];
    if (total <= sizeof(joined)) {
        char *d = joined;
        for (int i = 0; i < nrest; i++) {
            memcpy(d, rp[i], rn[i]);
            d += rn[i];
        }
        for (int m = 0; m < SK_MEMO; m++) {
            PyObject *k = sc->memo_key[m];
            if (k != NULL && (size_t)PyBytes_GET_SIZE(k) == total
                && memcmp(PyBytes_AS_STRING(k), joined, total) == 0) {
                *result = Py_NewRef(sc->memo_value[m]);
                return DONE;
            }
        }
        if ((key = PyBytes_FromStringAndSize(joined, (Py_ssize_t)total)) == NULL)
            return ERROR;
    }
    PyObject *list = PyList_New(nrest), *saved = NULL, *r = NULL;
    if (list == NULL)
        goto error;
    for (int i = 0; i < nrest; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)rp[i], (Py_ssize_t)rn[i]);
        if (b == NULL)
            goto error;
        PyList_SET_ITEM(list, i, b);
    }
    if ((saved = PyObject_GetAttrString(sc->limits, "truncated")) == NULL)
        goto error;
    r = PyObject_CallFunctionObjArgs(sc->attributes_json, list, Py_True, sc->limits, NULL);
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception) || PyErr_ExceptionMatches(PyExc_MemoryError))
            goto error;
        /* The span's error: Python's path raises it again, from the same counts. */
        PyErr_Clear();
        if (PyObject_SetAttrString(sc->limits, "truncated", saved) < 0)
            goto error;
        Py_DECREF(list);
        Py_DECREF(saved);
        Py_XDECREF(key);
        return FALLBACK;
    }
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 3 || !PyUnicode_Check(PyTuple_GET_ITEM(r, 0))
        || !PyLong_Check(PyTuple_GET_ITEM(r, 1)) || !PyLong_Check(PyTuple_GET_ITEM(r, 2))) {
        PyErr_SetString(PyExc_TypeError, "attributes_json must return (str, int, int)");
        goto error;
    }
    if (key != NULL) {
        Py_XSETREF(sc->memo_key[sc->memo_next], key);
        Py_XSETREF(sc->memo_value[sc->memo_next], Py_NewRef(r));
        sc->memo_next = (sc->memo_next + 1) % SK_MEMO;
    }
    Py_DECREF(list);
    Py_DECREF(saved);
    *result = r;
    return DONE;
error:
    Py_XDECREF(list);
    Py_XDECREF(saved);
    Py_XDECREF(r);
    Py_XDECREF(key);
    return ERROR;
}

/* One attribute into its promoted slot or the rest; FALLBACK for any other shape. */
static int attribute(SkScope *sc, const uint8_t *a, size_t n, PyObject **row,
                     const uint8_t **rp, size_t *rn, int *nrest)
{
    if (n < 5 || a[0] != 0x0A || a[1] > 0x7F)
        return FALLBACK;
    size_t key_end = 2 + (size_t)a[1];
    if (n < key_end + 3 || a[key_end] != 0x12 || a[key_end + 1] > 0x7F)
        return FALLBACK;
    size_t vlen = a[key_end + 1], total = key_end + 2 + vlen, off = key_end + 3;
    int tag = a[key_end + 2];
    if (n != total || (tag == TAG_DOUBLE ? vlen != 9 : tag == TAG_STRING || tag == TAG_INT
                                                          || tag == TAG_BOOL ? vlen < 2 : 1))
        return FALLBACK; /* not lite_spans.read_header's plain shape */
    int slot = promoted_slot(a + 2, key_end - 2);
    if (slot < 0) {
        if (*nrest == SK_MAX_REST)
            return FALLBACK;
        rp[*nrest] = a;
        rn[(*nrest)++] = n;
        return DONE;
    }
    int kind = sk_config.kind[slot];
    PyObject *value = NULL;
    if (kind == SK_STR) {
        if (tag != TAG_STRING || a[off] != total - off - 1)
            return FALLBACK;
        int r = text(sc, &sc->text[3 + slot], a + off + 1, total - off - 1, sc->max_value,
                     &value);
        if (r != DONE)
            return r;
    } else if (tag == TAG_DOUBLE && kind == SK_FLOAT) {
        double d;
        memcpy(&d, a + off, 8);
        if (!isfinite(d))
            return FALLBACK; /* Python keeps it in the JSON as "NaN"/"Infinity" */
        if ((value = PyFloat_FromDouble(d)) == NULL)
            return ERROR;
    } else if (tag == TAG_INT) {
        uint64_t u = 0;
        if (sk_varint_any(a + off, a + total, &u) != total - off)
            return FALLBACK;
        value = kind == SK_FLOAT ? PyFloat_FromDouble((double)(int64_t)u)
                                 : PyLong_FromLongLong((long long)(int64_t)u);
        if (value == NULL)
            return ERROR;
    } else {
        return FALLBACK; /* a kind its column does not take: Python keeps it in the JSON */
    }
    Py_XSETREF(row[SK_OWN + slot], value); /* a repeated key: the last one wins */
    return DONE;
}

typedef struct {
    const uint8_t *trace, *span, *parent, *state, *name, *message;
    size_t state_len, name_len, message_len;
    uint64_t kind, code, start, end, dropped, dropped_events, dropped_links;
    uint32_t flags;
    const uint8_t *attrs[MAX_ATTRS];
    size_t attr_len[MAX_ATTRS];
    int nattrs;
} SpanFields;

#define ONCE(bit)                     \
    if (seen & (1u << (bit)))         \
        return FALLBACK;              \
    seen |= 1u << (bit)

static int status_fields(const uint8_t *p, size_t n, SpanFields *s)
{
    const uint8_t *end = p + n;
    unsigned seen = 0;
    SkField f;
    while (p < end) {
        if (!sk_field(&p, end, &f))
            return FALLBACK;
        if (f.tag == 0x12 && f.len > 0) {
            ONCE(0);
            s->message = f.data;
            s->message_len = f.len;
        } else if (f.tag == 0x18 && f.value != 0 && f.value <= INT32_MAX) {
            ONCE(1);
            s->code = f.value;
        } else {
            return FALLBACK;
        }
    }
    return DONE;
}

/* Read a span's fields: DONE only for a canonical span with no events or links. */
static int span_fields(const uint8_t *p, size_t n, SpanFields *s)
{
    const uint8_t *end = p + n;
    unsigned seen = 0;
    SkField f;
    memset(s, 0, offsetof(SpanFields, attrs));
    s->nattrs = 0;
    while (p < end) {
        if (!sk_field(&p, end, &f))
            return FALLBACK;
        switch (f.tag) {
        case 0x0A: ONCE(0); if (f.len != 16) return FALLBACK; s->trace = f.data; break;
        case 0x12: ONCE(1); if (f.len != 8) return FALLBACK; s->span = f.data; break;
        case 0x1A: ONCE(2); if (f.len == 0) return FALLBACK;
            s->state = f.data; s->state_len = f.len; break;
        case 0x22: ONCE(3); if (f.len != 8) return FALLBACK; s->parent = f.data; break;
        case 0x2A: ONCE(4); if (f.len == 0) return FALLBACK;
            s->name = f.data; s->name_len = f.len; break;
        case 0x30: ONCE(5); if (f.value == 0 || f.value > INT32_MAX) return FALLBACK;
            s->kind = f.value; break;
        case 0x39: ONCE(6); s->start = sk_le64(f.data); break;
        case 0x41: ONCE(7); s->end = sk_le64(f.data); break;
        case 0x4A: if (s->nattrs == MAX_ATTRS) return FALLBACK;
            s->attrs[s->nattrs] = f.data; s->attr_len[s->nattrs++] = f.len; break;
        case 0x50: ONCE(8); if (f.value == 0 || f.value > UINT32_MAX) return FALLBACK;
            s->dropped = f.value; break;
        case 0x60: ONCE(9); if (f.value == 0 || f.value > UINT32_MAX) return FALLBACK;
            s->dropped_events = f.value; break;
        case 0x70: ONCE(10); if (f.value == 0 || f.value > UINT32_MAX) return FALLBACK;
            s->dropped_links = f.value; break;
        case 0x7A: ONCE(11); if (status_fields(f.data, f.len, s) != DONE) return FALLBACK;
            break;
        case 0x85: ONCE(12); s->flags = sk_le32(f.data); if (!s->flags) return FALLBACK;
            break; /* field 16, fixed32 */
        default: return FALLBACK; /* events, links, unknown fields: Python's path */
        }
    }
    return DONE;
}

/* One span -> `row` (new references) or FALLBACK/ERROR (row left for the caller to clear). */
int sk_span_row(SkScope *sc, const uint8_t *p, size_t n, PyObject **row)
{
    SpanFields s;
    const uint8_t *rp[SK_MAX_REST];
    size_t rn[SK_MAX_REST];
    int nrest = 0, r;
    if (span_fields(p, n, &s) != DONE || s.trace == NULL || s.span == NULL
        || !nonzero(s.trace, 16) || !nonzero(s.span, 8)
        || (s.parent != NULL && !nonzero(s.parent, 8)))
        return FALLBACK; /* hex_id's messages are Python's */
    if (s.start == 0 || s.start > s.end || s.end > (uint64_t)INT64_MAX
        || (long long)s.start < sc->earliest || (long long)s.end > sc->latest)
        return FALLBACK; /* check_time's messages too */
    for (int i = 0; i < s.nattrs; i++)
        if ((r = attribute(sc, s.attrs[i], s.attr_len[i], row, rp, rn, &nrest)) != DONE)
            return r;
    PyObject *json = NULL, *dropped = PyLong_FromUnsignedLongLong(s.dropped);
    if (dropped == NULL)
        return ERROR;
    if (nrest == 0) {
        json = Py_NewRef(sk_config.empty_object);
    } else {
        PyObject *result;
        if ((r = rest_json(sc, rp, rn, nrest, &result)) != DONE) {
            Py_DECREF(dropped);
            return r;
        }
        json = Py_NewRef(PyTuple_GET_ITEM(result, 0));
        Py_SETREF(dropped, PyNumber_Add(dropped, PyTuple_GET_ITEM(result, 1)));
        Py_ssize_t cut = PyLong_AsSsize_t(PyTuple_GET_ITEM(result, 2));
        Py_DECREF(result);
        if (dropped == NULL || (cut == -1 && PyErr_Occurred())) {
            Py_DECREF(json);
            Py_XDECREF(dropped);
            return ERROR;
        }
        sc->truncated += cut;
    }
    row[11] = json;
    row[14] = dropped;
    row[0] = hex(s.trace, 16);
    row[1] = hex(s.span, 8);
    row[2] = s.parent ? hex(s.parent, 8) : Py_NewRef(sk_config.empty_str);
    row[4] = PyLong_FromUnsignedLong(s.flags);
    row[6] = PyLong_FromUnsignedLongLong(s.kind);
    row[7] = PyLong_FromUnsignedLongLong(s.start);
    row[8] = PyLong_FromUnsignedLongLong(s.end);
    row[9] = PyLong_FromUnsignedLongLong(s.code);
    row[12] = Py_NewRef(sk_config.empty_list);
    row[13] = Py_NewRef(sk_config.empty_list);
    row[15] = PyLong_FromUnsignedLongLong(s.dropped_events);
    row[16] = PyLong_FromUnsignedLongLong(s.dropped_links);
    for (int i = 0; i < 17; i++)
        if (i != 3 && i != 5 && i != 10 && row[i] == NULL)
            return ERROR;
    const uint8_t *texts[3] = {s.name, s.state, s.message};
    size_t lens[3] = {s.name_len, s.state_len, s.message_len};
    int columns[3] = {5, 3, 10};
    for (int t = 0; t < 3; t++) {
        if (texts[t] == NULL) {
            row[columns[t]] = Py_NewRef(sk_config.empty_str);
        } else if ((r = text(sc, &sc->text[t], texts[t], lens[t],
                             t == 1 ? sc->max_name : sc->max_value, &row[columns[t]]))
                   != DONE) {
            return r;
        }
    }
    for (int i = 0; i < sk_config.promoted; i++)
        if (row[SK_OWN + i] == NULL)
            row[SK_OWN + i] = Py_NewRef(Py_None);
    return DONE;
}
