/* fleetlens.collector._spankernel: the span decoder's hot loop in C (issue 34, item 2).
 *
 * Python's decoder (collector/decode_spans.py) is the reference; this kernel only takes the
 * spans it can decode to exactly the same row, and hands every other span back by its bytes
 * (events, links, bad ids or times, an attribute not in the plain one-scalar shape, a
 * promoted key with a value its column does not take, any non-canonical encoding). So the
 * limits, the error messages and the partial success stay Python's, byte for byte.
 *
 *   walk(payload) -> None | [(resource bytes | None, schema_url, [(scope bytes | None,
 *                            schema_url, offset, length, spans)])]
 *   decode_scope(payload, offset, length, earliest_ns, latest_ns, max_value_bytes,
 *                max_name_bytes, attributes_json, limits)
 *       -> (columns, [(position, span bytes)], truncated, numbers)
 *
 * walk returns None unless the request, ResourceSpans and ScopeSpans levels are canonical
 * (then the whole request goes the Python way). Resource and scope messages are parsed by
 * the caller with the real protobuf types. The span walk is in _spankernel_span.c, the
 * scope loop and its Arrow buffers in _spankernel_scope.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_spankernel.h"

SkConfig sk_config;

/* Decode a (non-empty) UTF-8 field, or NULL with no error set when it is invalid. */
static PyObject *utf8_or_none(const uint8_t *p, size_t n)
{
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)n, NULL);
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    return s;
}

/* One ScopeSpans message -> (scope | None, schema_url, offset, length, spans); NULL with
 * no error set when it is not canonical. */
static PyObject *walk_scope(const uint8_t *base, const uint8_t *p, size_t n)
{
    const uint8_t *end = p + n, *scope = NULL, *url = NULL;
    size_t scope_len = 0, url_len = 0;
    Py_ssize_t spans = 0;
    SkField f;
    while (p < end) {
        if (!sk_field(&p, end, &f))
            return NULL;
        if (f.tag == 0x0A && scope == NULL) {
            scope = f.data;
            scope_len = f.len;
        } else if (f.tag == 0x12) {
            spans++;
        } else if (f.tag == 0x1A && url == NULL && f.len > 0) {
            url = f.data;
            url_len = f.len;
        } else {
            return NULL; /* unknown, repeated singular or explicit default: Python's way */
        }
    }
    PyObject *url_obj = url ? utf8_or_none(url, url_len) : PyUnicode_FromString("");
    if (url_obj == NULL)
        return NULL;
    PyObject *scope_obj = scope ? PyBytes_FromStringAndSize((const char *)scope,
                                                            (Py_ssize_t)scope_len)
                                : Py_NewRef(Py_None);
    if (scope_obj == NULL) {
        Py_DECREF(url_obj);
        return NULL;
    }
    return Py_BuildValue("(NNnnn)", scope_obj, url_obj, (Py_ssize_t)(end - n - base),
                         (Py_ssize_t)n, spans);
}

/* One ResourceSpans message -> (resource | None, schema_url, scopes); NULL when not
 * canonical (no error set) or on a Python error (error set). */
static PyObject *walk_resource(const uint8_t *base, const uint8_t *p, size_t n)
{
    const uint8_t *end = p + n, *resource = NULL, *url = NULL;
    size_t resource_len = 0, url_len = 0;
    PyObject *scopes = PyList_New(0);
    SkField f;
    if (scopes == NULL)
        return NULL;
    while (p < end) {
        if (!sk_field(&p, end, &f))
            goto fail;
        if (f.tag == 0x0A && resource == NULL) {
            resource = f.data;
            resource_len = f.len;
        } else if (f.tag == 0x12) {
            PyObject *scope = walk_scope(base, f.data, f.len);
            if (scope == NULL || PyList_Append(scopes, scope) < 0) {
                Py_XDECREF(scope);
                goto fail;
            }
            Py_DECREF(scope);
        } else if (f.tag == 0x1A && url == NULL && f.len > 0) {
            url = f.data;
            url_len = f.len;
        } else {
            goto fail;
        }
    }
    PyObject *url_obj = url ? utf8_or_none(url, url_len) : PyUnicode_FromString("");
    if (url_obj == NULL)
        goto fail;
    PyObject *res_obj = resource ? PyBytes_FromStringAndSize((const char *)resource,
                                                             (Py_ssize_t)resource_len)
                                 : Py_NewRef(Py_None);
    if (res_obj == NULL) {
        Py_DECREF(url_obj);
        goto fail;
    }
    return Py_BuildValue("(NNN)", res_obj, url_obj, scopes);
fail:
    Py_DECREF(scopes);
    return NULL;
}

static PyObject *sk_walk(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*:walk", &buf))
        return NULL;
    const uint8_t *base = buf.buf, *p = base, *end = base + buf.len;
    PyObject *out = PyList_New(0);
    SkField f;
    while (out != NULL && p < end) {
        PyObject *resource = NULL;
        if (sk_field(&p, end, &f) && f.tag == 0x0A)
            resource = walk_resource(base, f.data, f.len);
        if (resource == NULL || PyList_Append(out, resource) < 0)
            Py_CLEAR(out);
        Py_XDECREF(resource);
    }
    PyBuffer_Release(&buf);
    if (out == NULL && !PyErr_Occurred())
        Py_RETURN_NONE; /* not covered: the Python decoder takes the whole request */
    return out;
}

static PyObject *sk_decode_scope(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t offset, length, max_value, max_name;
    long long earliest, latest;
    SkScope scope;
    memset(&scope, 0, sizeof(scope));
    if (!PyArg_ParseTuple(args, "y*nnLLnnOO:decode_scope", &buf, &offset, &length, &earliest,
                          &latest, &max_value, &max_name, &scope.attributes_json,
                          &scope.limits))
        return NULL;
    if (sk_config.ready == 0 || offset < 0 || length < 0 || max_value < 0 || max_name < 0
        || offset > buf.len || length > buf.len - offset) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "decode_scope: not configured or bad bounds");
        return NULL;
    }
    scope.earliest = earliest;
    scope.latest = latest;
    scope.max_value = (size_t)max_value;
    scope.max_name = (size_t)max_name;
    PyObject *out = sk_scope_rows(&scope, (const uint8_t *)buf.buf + offset, (size_t)length);
    PyBuffer_Release(&buf);
    return out;
}

static PyObject *sk_configure(PyObject *self, PyObject *args)
{
    PyObject *promoted, *empty_object, *empty_list;
    if (!PyArg_ParseTuple(args, "O!UU:configure", &PyTuple_Type, &promoted, &empty_object,
                          &empty_list))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(promoted);
    if (n > SK_MAX_PROMOTED) {
        PyErr_SetString(PyExc_ValueError, "configure: too many promoted keys");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *key;
        Py_ssize_t key_len;
        int kind;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(promoted, i), "y#i", &key, &key_len, &kind))
            return NULL;
        if (key_len > SK_MAX_KEY || kind < SK_STR || kind > SK_INT) {
            PyErr_SetString(PyExc_ValueError, "configure: bad promoted key");
            return NULL;
        }
        memcpy(sk_config.keys[i], key, (size_t)key_len);
        sk_config.key_len[i] = (size_t)key_len;
        sk_config.kind[i] = kind;
    }
    sk_config.promoted = (int)n;
    Py_XSETREF(sk_config.empty_object, Py_NewRef(empty_object));
    Py_XSETREF(sk_config.empty_list, Py_NewRef(empty_list));
    if (sk_config.empty_str == NULL && (sk_config.empty_str = PyUnicode_FromString("")) == NULL)
        return NULL;
    sk_config.ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", sk_configure, METH_VARARGS,
     "configure(promoted, empty_object, empty_list): promoted = ((key bytes, kind), ...) in "
     "column order, kind 0 str, 1 float, 2 int."},
    {"walk", sk_walk, METH_VARARGS, "walk(payload): the request's scopes, or None."},
    {"decode_scope", sk_decode_scope, METH_VARARGS,
     "decode_scope(payload, offset, length, earliest_ns, latest_ns, max_value_bytes, "
     "max_name_bytes, attributes_json, limits) -> (columns, fallbacks, truncated, numbers)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_spankernel",
    "The span decoder's hot loop in C; collector/decode_spans.py is the reference.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__spankernel(void)
{
    return PyModule_Create(&module);
}
