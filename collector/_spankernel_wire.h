/* Protobuf wire helpers of the span kernel (collector/_spankernel.c).
 *
 * Every reader is bounds-checked and returns 0 when the bytes are not in the canonical form
 * the kernel accepts: the caller then hands the item to the Python decoder, which is the
 * reference. "Canonical" is what upb re-encodes byte for byte (shortest varints, no explicit
 * defaults), so the kernel never has to decide whether a request held unknown fields.
 */
#ifndef FLEETLENS_SPANKERNEL_WIRE_H
#define FLEETLENS_SPANKERNEL_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* fixed64/fixed32 are read with memcpy as protobuf stores them, little-endian: a big-endian
 * build fails here, the optional extension is skipped and the Python decoder runs. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the span kernel reads protobuf's little-endian fixed fields as native integers"
#endif

/* Any varint of up to 10 bytes ending before `end` (no canonical check): the low 64 bits,
 * as Python's lite_spans.varint keeps them. Returns bytes read, 0 when malformed. */
static inline size_t sk_varint_any(const uint8_t *p, const uint8_t *end, uint64_t *out)
{
    uint64_t value = 0;
    for (size_t i = 0; i < 10 && p + i < end; i++) {
        value |= (uint64_t)(p[i] & 0x7F) << (7 * i);
        if (p[i] < 0x80) {
            *out = value;
            return i + 1;
        }
    }
    return 0;
}

/* A varint in its shortest encoding (what the encoder writes back): bytes read or 0. */
static inline size_t sk_varint(const uint8_t *p, const uint8_t *end, uint64_t *out)
{
    size_t n = sk_varint_any(p, end, out);
    if (n == 0 || (n > 1 && p[n - 1] == 0))
        return 0; /* a trailing zero byte: an overlong encoding */
    if (n == 10 && p[9] > 1)
        return 0; /* bits past 64: upb drops them, re-encoding would differ */
    return n;
}

/* One field: its tag, and for length-delimited fields the payload's bounds. */
typedef struct {
    uint64_t tag;
    const uint8_t *data; /* length-delimited: payload; fixed: the value's bytes */
    size_t len;
    uint64_t value; /* varint fields */
} SkField;

/* Read the field at *pp (canonical tag and length). Returns 1 and advances, or 0. */
static inline int sk_field(const uint8_t **pp, const uint8_t *end, SkField *f)
{
    const uint8_t *p = *pp;
    size_t n = sk_varint(p, end, &f->tag);
    if (n == 0 || f->tag >> 3 == 0)
        return 0;
    p += n;
    switch (f->tag & 7) {
    case 0: /* varint */
        n = sk_varint(p, end, &f->value);
        if (n == 0)
            return 0;
        p += n;
        break;
    case 1: /* fixed64 */
        if (end - p < 8)
            return 0;
        f->data = p;
        p += 8;
        break;
    case 2: { /* length-delimited */
        uint64_t len;
        n = sk_varint(p, end, &len);
        if (n == 0 || len > (uint64_t)(end - p - n))
            return 0;
        f->data = p + n;
        f->len = (size_t)len;
        p += n + len;
        break;
    }
    case 5: /* fixed32 */
        if (end - p < 4)
            return 0;
        f->data = p;
        p += 4;
        break;
    default:
        return 0;
    }
    *pp = p;
    return 1;
}

static inline uint64_t sk_le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian, as protobuf's fixed64 (checked above) */
    return v;
}

static inline uint32_t sk_le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The length of the longest prefix of valid UTF-8 `p[0:n]` that is at most `limit` bytes
 * and ends on a character boundary: what Python's raw[:limit].decode("utf-8", "ignore")
 * keeps of a valid string. */
static inline size_t sk_utf8_cut(const uint8_t *p, size_t n, size_t limit)
{
    if (n <= limit)
        return n;
    size_t cut = limit;
    while (cut > 0 && (p[cut] & 0xC0) == 0x80)
        cut--; /* p[cut] continues the character that straddles the limit: drop it */
    return cut;
}

#endif
