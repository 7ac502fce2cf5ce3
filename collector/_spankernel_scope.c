/* One ScopeSpans message -> columns: the span kernel's loop over sk_span_row, with every
 * row column also written as Arrow buffers (int64/double data, large_string offsets and
 * UTF-8, validity bits), so that the collector's Arrow step takes them as they are instead
 * of converting each value (collector/span_kernel.py, ArrowColumn).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_spankernel.h"

/* The number of spans (field 2) in a ScopeSpans message, -1 if it is not one. */
static Py_ssize_t count_spans(const uint8_t *p, const uint8_t *end)
{
    Py_ssize_t count = 0;
    SkField f;
    while (p < end) {
        if (!sk_field(&p, end, &f))
            return -1;
        count += f.tag == 0x12;
    }
    return count;
}

/* Arrow kinds of the columns written as buffers. */
#define A_INT64 0
#define A_DOUBLE 1
#define A_STRING 2

/* One column's values as Arrow buffers: int64/double data, or large_string offsets and
 * UTF-8 data; validity bits. Bytes objects are filled in place before anyone sees them. */
typedef struct {
    int column, kind;
    PyObject *data, *offsets, *validity;
    char *text; /* strings: the UTF-8 data while it grows (PyMem) */
    size_t text_len, text_cap;
    Py_ssize_t nulls;
} SkArrow;

static int add_column(SkArrow *out, int *n, int column, int kind, Py_ssize_t count)
{
    SkArrow *c = &out[(*n)++];
    memset(c, 0, sizeof(*c));
    c->column = column;
    c->kind = kind;
    c->validity = PyBytes_FromStringAndSize(NULL, (count + 7) / 8);
    if (kind == A_STRING) {
        c->offsets = PyBytes_FromStringAndSize(NULL, 8 * (count + 1));
        c->text_cap = 64 + 16 * (size_t)count;
        if (c->offsets == NULL)
            return -1;
        if ((c->text = PyMem_Malloc(c->text_cap)) == NULL) {
            PyErr_NoMemory(); /* PyMem_Malloc sets no exception: say why, not SystemError */
            return -1;
        }
        memset(PyBytes_AS_STRING(c->offsets), 0, 8);
    } else if ((c->data = PyBytes_FromStringAndSize(NULL, 8 * count)) == NULL) {
        return -1;
    }
    if (c->validity == NULL)
        return -1;
    memset(PyBytes_AS_STRING(c->validity), 0, (size_t)(count + 7) / 8);
    return 0;
}

/* The row columns written as buffers: all but the per-resource ones (Python's). */
static int arrow_columns(SkArrow *out, Py_ssize_t count)
{
    static const int own[SK_OWN] = {A_STRING, A_STRING, A_STRING, A_STRING, A_INT64, A_STRING,
                                    A_INT64, A_INT64, A_INT64, A_INT64, A_STRING, A_STRING,
                                    A_STRING, A_STRING, A_INT64, A_INT64, A_INT64};
    int n = 0;
    for (int i = 0; i < SK_OWN; i++)
        if (add_column(out, &n, i, own[i], count) < 0)
            return -1;
    for (int i = 0; i < sk_config.promoted; i++) {
        int kind = sk_config.kind[i] == SK_STR ? A_STRING
                   : sk_config.kind[i] == SK_FLOAT ? A_DOUBLE : A_INT64;
        if (add_column(out, &n, SK_OWN + i, kind, count) < 0)
            return -1;
    }
    return n;
}

static int store_text(SkArrow *c, PyObject *v, Py_ssize_t at)
{
    Py_ssize_t len;
    const char *utf8 = PyUnicode_AsUTF8AndSize(v, &len); /* ASCII: the str's own bytes */
    if (utf8 == NULL)
        return -1;
    if (c->text_len + (size_t)len > c->text_cap) {
        size_t cap = 2 * c->text_cap + (size_t)len;
        char *grown = PyMem_Realloc(c->text, cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        c->text = grown;
        c->text_cap = cap;
    }
    memcpy(c->text + c->text_len, utf8, (size_t)len);
    c->text_len += (size_t)len;
    int64_t end = (int64_t)c->text_len;
    memcpy(PyBytes_AS_STRING(c->offsets) + 8 * (at + 1), &end, 8);
    return 0;
}

/* Row `at`'s values into the buffers (the same values as its Python objects). */
static int store_row(SkArrow *cols, int n, PyObject **row, Py_ssize_t at)
{
    for (int i = 0; i < n; i++) {
        SkArrow *c = &cols[i];
        PyObject *v = row[c->column];
        if (v == Py_None) {
            c->nulls++;
            if (c->kind == A_STRING) {
                int64_t end = (int64_t)c->text_len;
                memcpy(PyBytes_AS_STRING(c->offsets) + 8 * (at + 1), &end, 8);
            } else {
                memset(PyBytes_AS_STRING(c->data) + 8 * at, 0, 8);
            }
            continue;
        }
        PyBytes_AS_STRING(c->validity)[at / 8] |= (char)(1 << (at % 8));
        if (c->kind == A_STRING) {
            if (store_text(c, v, at) < 0)
                return -1;
        } else if (c->kind == A_DOUBLE) {
            double d = PyFloat_AS_DOUBLE(v);
            memcpy(PyBytes_AS_STRING(c->data) + 8 * at, &d, 8);
        } else {
            long long x = PyLong_AsLongLong(v);
            if (x == -1 && PyErr_Occurred())
                return -1;
            memcpy(PyBytes_AS_STRING(c->data) + 8 * at, &x, 8);
        }
    }
    return 0;
}

/* (column index, kind, data, offsets | None, validity | None, nulls) of each column. */
static PyObject *arrow_result(SkArrow *cols, int n)
{
    PyObject *out = PyTuple_New(n);
    for (int i = 0; out != NULL && i < n; i++) {
        SkArrow *c = &cols[i];
        if (c->kind == A_STRING && c->data == NULL
            && (c->data = PyBytes_FromStringAndSize(c->text, (Py_ssize_t)c->text_len)) == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyObject *item = Py_BuildValue("(iiOOOn)", c->column, c->kind, c->data,
                                       c->offsets ? c->offsets : Py_None,
                                       c->nulls ? c->validity : Py_None, c->nulls);
        if (item == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, i, item);
    }
    return out;
}

static void free_arrow(SkArrow *cols, int n)
{
    for (int i = 0; i < n; i++) {
        Py_XDECREF(cols[i].data);
        Py_XDECREF(cols[i].offsets);
        Py_XDECREF(cols[i].validity);
        PyMem_Free(cols[i].text);
    }
}

PyObject *sk_scope_rows(SkScope *sc, const uint8_t *p, size_t n)
{
    const uint8_t *end = p + n;
    int ncols = SK_OWN + sk_config.promoted, narrow = 0;
    Py_ssize_t count = count_spans(p, end), position = 0, rows = 0;
    PyObject *columns = NULL, *fallbacks = NULL, *numbers = NULL, *out = NULL;
    SkArrow arrow[SK_MAX_COLUMNS];
    SkField f;
    memset(arrow, 0, sizeof(arrow));
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "decode_scope: not a ScopeSpans message");
        return NULL;
    }
    if ((columns = PyTuple_New(ncols)) == NULL || (fallbacks = PyList_New(0)) == NULL
        || (narrow = arrow_columns(arrow, count)) < 0)
        goto done;
    for (int i = 0; i < ncols; i++) {
        /* Sized for every span (appending costs more); cut to the rows taken at the end. */
        PyObject *list = PyList_New(count);
        if (list == NULL)
            goto done;
        PyTuple_SET_ITEM(columns, i, list);
    }
    while (p < end) {
        sk_field(&p, end, &f); /* count_spans read the same fields */
        if (f.tag != 0x12)
            continue; /* scope, schema_url: walk's and the caller's */
        PyObject *row[SK_MAX_COLUMNS] = {NULL};
        Py_ssize_t truncated = sc->truncated;
        int r = sk_span_row(sc, f.data, f.len, row);
        if (r == DONE && store_row(arrow, narrow, row, rows) < 0)
            r = ERROR;
        for (int i = 0; i < ncols; i++) {
            if (r == DONE)
                PyList_SET_ITEM(PyTuple_GET_ITEM(columns, i), rows, row[i]); /* steals */
            else
                Py_XDECREF(row[i]);
        }
        if (r == ERROR)
            goto done;
        if (r == DONE) {
            rows++;
        } else {
            sc->truncated = truncated; /* Python's path counts this span's cuts */
            PyObject *item = Py_BuildValue("(ny#)", position, (const char *)f.data,
                                           (Py_ssize_t)f.len);
            if (item == NULL || PyList_Append(fallbacks, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
        }
        position++;
    }
    for (int i = 0; rows < count && i < ncols; i++)
        if (PyList_SetSlice(PyTuple_GET_ITEM(columns, i), rows, count, NULL) < 0)
            goto done;
    if ((numbers = arrow_result(arrow, narrow)) != NULL)
        out = Py_BuildValue("(OOnO)", columns, fallbacks, sc->truncated, numbers);
done:
    Py_XDECREF(columns);
    Py_XDECREF(fallbacks);
    Py_XDECREF(numbers);
    free_arrow(arrow, narrow < 0 ? SK_MAX_COLUMNS : narrow);
    for (int t = 0; t < 3 + SK_MAX_PROMOTED; t++)
        Py_CLEAR(sc->text[t].obj);
    for (int m = 0; m < SK_MEMO; m++) {
        Py_CLEAR(sc->memo_key[m]);
        Py_CLEAR(sc->memo_value[m]);
    }
    return out;
}
