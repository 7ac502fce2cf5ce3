/* Shared declarations of the span kernel (_spankernel.c, _spankernel_span.c). */
#ifndef FLEETLENS_SPANKERNEL_H
#define FLEETLENS_SPANKERNEL_H

#include <Python.h>

#include "_spankernel_wire.h"

#define SK_MAX_PROMOTED 16
#define SK_MAX_KEY 64
/* Columns of one row: collector/decode_spans.py _OWN, then the promoted ones. */
#define SK_OWN 17
#define SK_MAX_COLUMNS (SK_OWN + SK_MAX_PROMOTED)
/* Kinds of promoted columns (configure's `kind`). */
#define SK_STR 0
#define SK_FLOAT 1
#define SK_INT 2
/* Non-promoted attributes one span may carry on the kernel's path (more: Python's). */
#define SK_MAX_REST 128
/* Distinct non-promoted attribute sets remembered per call (their JSON, from Python). */
#define SK_MEMO 8

typedef struct {
    int ready;
    int promoted;
    char keys[SK_MAX_PROMOTED][SK_MAX_KEY];
    size_t key_len[SK_MAX_PROMOTED];
    int kind[SK_MAX_PROMOTED];
    PyObject *empty_object, *empty_list, *empty_str;
} SkConfig;

extern SkConfig sk_config;

/* The last text decoded into one column: spans of a scope repeat their name and model. */
typedef struct {
    PyObject *obj;
    const uint8_t *p;
    size_t n;
    int cut;
} SkText;

/* The state of one decode_scope call. */
typedef struct {
    long long earliest, latest;
    size_t max_value, max_name;
    PyObject *attributes_json, *limits;
    Py_ssize_t truncated;
    /* name, trace_state, status message, then one per promoted column */
    SkText text[3 + SK_MAX_PROMOTED];
    PyObject *memo_key[SK_MEMO], *memo_value[SK_MEMO];
    int memo_next;
} SkScope;

/* What sk_span_row and its helpers return. */
#define FALLBACK 0
#define DONE 1
#define ERROR (-1)

/* One encoded span -> `row` (new references; DONE), FALLBACK (Python's) or ERROR. */
int sk_span_row(SkScope *scope, const uint8_t *p, size_t n, PyObject **row);

/* (columns, fallbacks, truncated, numbers) of the spans in one ScopeSpans message. */
PyObject *sk_scope_rows(SkScope *scope, const uint8_t *p, size_t n);

#endif
