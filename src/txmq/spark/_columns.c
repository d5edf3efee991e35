/* txmq.spark._ccolumns: a PULL_MESSAGE reply body -> the Arrow buffers of the Spark source's
 * columns (txmq.spark._arrow.ARROW_SCHEMA), in C, in two passes over the reply.
 *
 * Input: MessageExt records back to back. Layout (RocketMQ MessageDecoder.encode / decode; drawn
 * with its struct format in src/txmq/protocol/_message_codec.py), big-endian, signed:
 *
 *     0 total size i32 | 4 magic u32 (0xDAA320A7 v1, 0xDAA320AB v2) | 8 body CRC i32
 *    12 queue id i32 | 16 flag i32 | 20 queue offset i64 | 28 commit log offset i64
 *    36 sysFlag i32 | 40 born timestamp i64 (ms) | 48 born host H | store timestamp i64 (ms)
 *    store host H | reconsume times i32 | prepared transaction offset i64 | body length B i32
 *    body (B) | topic length i8 (v1) or i16 (v2) | topic (UTF-8) | properties length i16
 *    properties (UTF-8, "name\x01value\x02" repeated)
 *
 * H is 8 bytes (IPv4 + i32 port) or 20 (IPv6 + i32 port), by sysFlag's BORNHOST_V6_FLAG (0x10)
 * and STOREHOSTADDRESS_V6_FLAG (0x20).
 *
 * Pass 1 checks every record as txmq.protocol.decode_message_exts does (lengths, magic codes,
 * ports, body CRC32 with zlib's polynomial, which is java.util.zip.CRC32's; strict UTF-8 of the
 * topic and the properties, as Python's decoder) and what the columnar path does not take
 * (compressed bodies, timestamps whose microseconds overflow int64), and sums the output sizes.
 * Pass 2 writes the columns. Both run without the GIL. Any record not taken makes the whole call
 * return None: the caller then runs the per-message decoder, which raises its own errors. Every
 * read is bounds-checked against the buffer and every write against its allocation.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define MAGIC_V1 0xDAA320A7u
#define MAGIC_V2 0xDAA320ABu
#define PREFIX_BYTES 40            /* total size .. sysFlag: what locates the head's layout */
#define SYSFLAG_AT 36
#define BORN_HOST_AT 48
#define COMPRESSED_FLAG 0x1
#define CRC_MASK 0x7FFFFFFF
#define PORT_MAX 0xFFFF
#define REPLY_MAX_BYTES 0x7FFFFFFF /* Arrow's int32 offsets */
#define PROPS_MAX_BYTES 32767      /* an i16 length */
#define ENTRIES_MAX ((PROPS_MAX_BYTES + 1) / 4 + 1) /* "a\x01b" + "\x02" per kept entry */
#define TS_MS_MIN (INT64_MIN / 1000) /* ms whose us fit int64 (C division truncates toward 0) */
#define TS_MS_MAX (INT64_MAX / 1000)
#define NAME_VALUE_SEPARATOR 0x01
#define PROPERTY_SEPARATOR 0x02

typedef struct {
    int64_t start, end;             /* the record's bytes */
    int64_t body_start, body_end, topic_start, topic_end, props_start;
    int32_t crc, queue_id, sys_flag;
    int64_t queue_offset, born_ms, store_ms;
} Rec;

static inline int32_t be32(const uint8_t *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

static inline int64_t be64(const uint8_t *p) {
    return (int64_t)(((uint64_t)(uint32_t)be32(p) << 32) | (uint32_t)be32(p + 4));
}

static inline int16_t be16(const uint8_t *p) { return (int16_t)(((unsigned)p[0] << 8) | p[1]); }

/* The record at p[pos:n] into r, with decode_message_exts's checks in its order; 0, or -1 if
 * malformed. Reads nothing outside p[pos:n]. */
static int parse_record(const uint8_t *p, int64_t n, int64_t pos, Rec *r) {
    if (n - pos < PREFIX_BYTES) return -1;
    const uint8_t *h = p + pos;
    int32_t total = be32(h);
    uint32_t magic = (uint32_t)be32(h + 4);
    int tls = magic == MAGIC_V1 ? 1 : magic == MAGIC_V2 ? 2 : 0;
    if (!tls) return -1;
    int32_t sys_flag = be32(h + SYSFLAG_AT);
    int layout = (int)(((uint32_t)sys_flag >> 4) & 3);
    int64_t born = (layout & 1) ? 20 : 8, store = (layout & 2) ? 20 : 8;
    int64_t head = BORN_HOST_AT + born + 8 + store + 4 + 8 + 4;
    int64_t end = pos + total;
    if (total < head + tls + 2 || end > n) return -1;
    int32_t born_port = be32(h + BORN_HOST_AT + born - 4);
    int64_t store_at = BORN_HOST_AT + born + 8;
    int32_t store_port = be32(h + store_at + store - 4);
    int32_t body_len = be32(h + head - 4);
    int64_t b0 = pos + head, b1 = b0 + body_len;
    if (body_len < 0 || b1 + tls > end) return -1;
    int64_t topic_len = tls == 1 ? (int8_t)p[b1] : be16(p + b1);
    int64_t t0 = b1 + tls, t1 = t0 + topic_len;
    if (topic_len < 0 || t1 + 2 > end) return -1;
    int64_t props_len = be16(p + t1);
    if (props_len < 0 || t1 + 2 + props_len != end) return -1;
    if (born_port < 0 || born_port > PORT_MAX || store_port < 0 || store_port > PORT_MAX) return -1;
    r->start = pos;
    r->end = end;
    r->body_start = b0;
    r->body_end = b1;
    r->topic_start = t0;
    r->topic_end = t1;
    r->props_start = t1 + 2;
    r->crc = be32(h + 8);
    r->queue_id = be32(h + 12);
    r->queue_offset = be64(h + 20);
    r->sys_flag = sys_flag;
    r->born_ms = be64(h + 40);
    r->store_ms = be64(h + BORN_HOST_AT + born);
    return 0;
}

/* Whether s[0:len] is UTF-8 as Python's strict decoder reads it (no overlong forms, no
 * surrogates, nothing past U+10FFFF). Unicode 15, table 3-7 (well-formed byte sequences). */
static int utf8_valid(const uint8_t *s, int64_t len) {
    int64_t i = 0;
    while (i < len) {
        if (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i += 1;
            continue;
        }
        int need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return 0;
        }
        if (i + need >= len) return 0; /* the sequence's last byte is s[i + need] */
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return 0;
        i += need + 1;
    }
    return 1;
}

/* Sizes pass 1 finds: what pass 2 writes is at most these. */
typedef struct {
    int64_t count, body_bytes, topic_bytes, props_bytes, entries_max, record_entries_max;
} Sizes;

/* Pass 1: 0 with sizes filled, or -1 if a record is malformed or not columnar. */
static int check_reply(const uint8_t *p, int64_t n, Sizes *sz) {
    memset(sz, 0, sizeof *sz);
    Rec r;
    for (int64_t pos = 0; pos < n; pos = r.end) {
        if (parse_record(p, n, pos, &r) < 0) return -1;
        int64_t body_len = r.body_end - r.body_start;
        if (body_len > 0) {
            uLong crc = crc32(0L, p + r.body_start, (uInt)body_len);
            if ((int64_t)(crc & CRC_MASK) != (int64_t)r.crc) return -1;
            if (r.sys_flag & COMPRESSED_FLAG) return -1; /* the per-message path inflates */
        }
        if (r.born_ms < TS_MS_MIN || r.born_ms > TS_MS_MAX || r.store_ms < TS_MS_MIN ||
            r.store_ms > TS_MS_MAX)
            return -1;
        int64_t props_len = r.end - r.props_start;
        if (!utf8_valid(p + r.topic_start, r.topic_end - r.topic_start) ||
            !utf8_valid(p + r.props_start, props_len))
            return -1;
        sz->count += 1;
        sz->body_bytes += body_len;
        sz->topic_bytes += r.topic_end - r.topic_start;
        sz->props_bytes += props_len;
        sz->entries_max += (props_len + 1) / 4;
        if ((props_len + 1) / 4 + 1 > sz->record_entries_max)
            sz->record_entries_max = (props_len + 1) / 4 + 1;
    }
    return 0;
}

/* One property entry: name p[ns:ns+nl], value p[vs:vs+vl]. */
typedef struct {
    int64_t ns, vs;
    int32_t nl, vl;
} Entry;

static int name_cmp(const uint8_t *p, const Entry *a, const Entry *b) {
    int32_t m = a->nl < b->nl ? a->nl : b->nl;
    int c = memcmp(p + a->ns, p + b->ns, (size_t)m);
    if (c) return c;
    return (a->nl > b->nl) - (a->nl < b->nl);
}

/* Stable bottom-up merge sort of e[0:k] by name (UTF-8 byte order is code point order, so
 * Python's str order); tmp holds k entries. */
static void sort_entries(const uint8_t *p, Entry *e, Entry *tmp, int64_t k) {
    for (int64_t width = 1; width < k; width *= 2) {
        for (int64_t lo = 0; lo < k; lo += 2 * width) {
            int64_t mid = lo + width < k ? lo + width : k, hi = lo + 2 * width < k ? lo + 2 * width : k;
            int64_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi) tmp[o++] = name_cmp(p, &e[j], &e[i]) < 0 ? e[j++] : e[i++];
            while (i < mid) tmp[o++] = e[i++];
            while (j < hi) tmp[o++] = e[j++];
        }
        memcpy(e, tmp, (size_t)k * sizeof *e);
    }
}

/* A variable-width column being written: offsets (int32), data, validity (NULL: none kept). */
typedef struct {
    int32_t *offsets;
    uint8_t *data, *validity;
    int64_t data_cap, data_len, nulls;
} VarCol;

static int var_put(VarCol *c, int64_t row, const uint8_t *src, int64_t len) {
    if (len > c->data_cap - c->data_len) return -1;
    if (len) memcpy(c->data + c->data_len, src, (size_t)len);
    c->data_len += len;
    c->offsets[row + 1] = (int32_t)c->data_len;
    if (c->validity) c->validity[row >> 3] |= (uint8_t)(1u << (row & 7));
    return 0;
}

static void var_null(VarCol *c, int64_t row) {
    c->offsets[row + 1] = (int32_t)c->data_len;
    c->nulls += 1;
}

static inline int ascii_space(uint8_t c) { /* Python's str.isspace() on ASCII */
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
}

/* The key column's row: the first whitespace-separated key of KEYS (str.split semantics) when
 * KEYS is ASCII; the whole value when not (*unicode set: Python splits it). */
static int put_first_key(VarCol *c, int64_t row, const uint8_t *v, int64_t len, int *unicode) {
    if (!v) {
        var_null(c, row);
        return 0;
    }
    for (int64_t i = 0; i < len; i++)
        if (v[i] >= 0x80) {
            *unicode = 1;
            return var_put(c, row, v, len);
        }
    int64_t a = 0;
    while (a < len && ascii_space(v[a])) a++;
    int64_t b = a;
    while (b < len && !ascii_space(v[b])) b++;
    if (b == a) {
        var_null(c, row);
        return 0;
    }
    return var_put(c, row, v + a, b - a);
}

typedef struct {
    VarCol key, tags, body, topic, id, names, values;
    int32_t *queue_id, *map_offsets;
    int64_t *queue_offset, *born_us, *store_us;
    int64_t entries, entries_cap;
    Entry *scratch, *tmp;
    int64_t scratch_cap;
    int keys_unicode;
} Out;

static int name_is(const uint8_t *p, const Entry *e, const char *name, int32_t len) {
    return e->nl == len && memcmp(p + e->ns, name, (size_t)len) == 0;
}

/* The properties of one record (p[s:end]) into the tags, key, id and map columns. RocketMQ
 * MessageDecoder.string2messageProperties as txmq.protocol.decode_properties reads it: entries
 * between \x02, name and value split at the first \x01, both non-empty or the entry is skipped,
 * a repeated name keeps its last value; TAGS, KEYS and __CRC32# leave the map; sorted by name. */
static int put_properties(Out *o, const uint8_t *p, int64_t row, int64_t s, int64_t end) {
    const uint8_t *tags = NULL, *keys = NULL, *id = NULL;
    int64_t tags_len = 0, keys_len = 0, id_len = 0, k = 0;
    for (int64_t a = s; a <= end;) {
        const uint8_t *sep = a < end ? memchr(p + a, PROPERTY_SEPARATOR, (size_t)(end - a)) : NULL;
        int64_t e = sep ? sep - p : end;
        const uint8_t *cut = e > a ? memchr(p + a, NAME_VALUE_SEPARATOR, (size_t)(e - a)) : NULL;
        int64_t c = cut ? cut - p : 0;
        if (cut && c > a && e > c + 1) {
            if (k >= o->scratch_cap) return -1;
            Entry en = {a, c + 1, (int32_t)(c - a), (int32_t)(e - c - 1)};
            if (name_is(p, &en, "TAGS", 4)) {
                tags = p + en.vs, tags_len = en.vl;
            } else if (name_is(p, &en, "KEYS", 4)) {
                keys = p + en.vs, keys_len = en.vl;
            } else if (!name_is(p, &en, "__CRC32#", 8)) {
                if (name_is(p, &en, "UNIQ_KEY", 8)) id = p + en.vs, id_len = en.vl;
                o->scratch[k++] = en;
            }
        }
        a = e + 1;
    }
    int sorted = 1;
    for (int64_t i = 1; i < k && sorted; i++) sorted = name_cmp(p, &o->scratch[i - 1], &o->scratch[i]) < 0;
    if (!sorted) sort_entries(p, o->scratch, o->tmp, k);
    for (int64_t i = 0; i < k; i++) {
        if (i + 1 < k && name_cmp(p, &o->scratch[i], &o->scratch[i + 1]) == 0) continue; /* last wins */
        if (o->entries >= o->entries_cap) return -1;
        Entry *en = &o->scratch[i];
        if (var_put(&o->names, o->entries, p + en->ns, en->nl) < 0 ||
            var_put(&o->values, o->entries, p + en->vs, en->vl) < 0)
            return -1;
        o->entries += 1;
    }
    o->map_offsets[row + 1] = (int32_t)o->entries;
    if (tags ? var_put(&o->tags, row, tags, tags_len) : (var_null(&o->tags, row), 0)) return -1;
    if (id ? var_put(&o->id, row, id, id_len) : (var_null(&o->id, row), 0)) return -1;
    return put_first_key(&o->key, row, keys, keys_len, &o->keys_unicode);
}

/* Pass 2: every column of the count records of p[0:n]; 0, or -1 if the buffer no longer agrees
 * with pass 1 (it changed meanwhile). */
static int fill_columns(const uint8_t *p, int64_t n, int64_t count, Out *o) {
    Rec r;
    int64_t row = 0;
    for (int64_t pos = 0; pos < n; pos = r.end, row++) {
        if (row >= count || parse_record(p, n, pos, &r) < 0) return -1;
        if (var_put(&o->body, row, p + r.body_start, r.body_end - r.body_start) < 0 ||
            var_put(&o->topic, row, p + r.topic_start, r.topic_end - r.topic_start) < 0 ||
            put_properties(o, p, row, r.props_start, r.end) < 0)
            return -1;
        o->queue_id[row] = r.queue_id;
        o->queue_offset[row] = r.queue_offset;
        if (r.born_ms < TS_MS_MIN || r.born_ms > TS_MS_MAX || r.store_ms < TS_MS_MIN || r.store_ms > TS_MS_MAX)
            return -1;
        o->born_us[row] = r.born_ms * 1000;
        o->store_us[row] = r.store_ms * 1000;
    }
    return row == count ? 0 : -1;
}

/* --- Python objects ---------------------------------------------------------------------- */

/* A new bytes object of size bytes, its data at *data (zeroed when zero is set). */
static PyObject *new_bytes(int64_t size, void *data, int zero) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (!b) return NULL;
    if (zero) memset(PyBytes_AS_STRING(b), 0, (size_t)size);
    *(char **)data = PyBytes_AS_STRING(b);
    return b;
}

enum { B_KEY_V, B_KEY_O, B_KEY_D, B_TAGS_V, B_TAGS_O, B_TAGS_D, B_BODY_O, B_BODY_D, B_TOPIC_O,
       B_TOPIC_D, B_QID, B_QOFF, B_ID_V, B_ID_O, B_ID_D, B_BORN, B_STORE, B_MAP_O, B_NAMES_O,
       B_NAMES_D, B_VALUES_O, B_VALUES_D, B_COUNT };

static int var_alloc(PyObject **bufs, int vi, int oi, int di, VarCol *c, int64_t rows, int64_t cap) {
    memset(c, 0, sizeof *c);
    c->data_cap = cap;
    if (vi >= 0 && !(bufs[vi] = new_bytes((rows + 7) / 8, &c->validity, 1))) return -1;
    if (!(bufs[oi] = new_bytes((rows + 1) * 4, &c->offsets, 0))) return -1;
    c->offsets[0] = 0;
    return (bufs[di] = new_bytes(cap, &c->data, 0)) ? 0 : -1;
}

static int alloc_out(PyObject **bufs, Out *o, const Sizes *sz) {
    int64_t n = sz->count, pb = sz->props_bytes;
    memset(o, 0, sizeof *o);
    if (var_alloc(bufs, B_KEY_V, B_KEY_O, B_KEY_D, &o->key, n, pb) < 0 ||
        var_alloc(bufs, B_TAGS_V, B_TAGS_O, B_TAGS_D, &o->tags, n, pb) < 0 ||
        var_alloc(bufs, -1, B_BODY_O, B_BODY_D, &o->body, n, sz->body_bytes) < 0 ||
        var_alloc(bufs, -1, B_TOPIC_O, B_TOPIC_D, &o->topic, n, sz->topic_bytes) < 0 ||
        var_alloc(bufs, B_ID_V, B_ID_O, B_ID_D, &o->id, n, pb) < 0 ||
        var_alloc(bufs, -1, B_NAMES_O, B_NAMES_D, &o->names, sz->entries_max, pb) < 0 ||
        var_alloc(bufs, -1, B_VALUES_O, B_VALUES_D, &o->values, sz->entries_max, pb) < 0)
        return -1;
    o->entries_cap = sz->entries_max;
    if (!(bufs[B_QID] = new_bytes(n * 4, &o->queue_id, 0)) ||
        !(bufs[B_QOFF] = new_bytes(n * 8, &o->queue_offset, 0)) ||
        !(bufs[B_BORN] = new_bytes(n * 8, &o->born_us, 0)) ||
        !(bufs[B_STORE] = new_bytes(n * 8, &o->store_us, 0)) ||
        !(bufs[B_MAP_O] = new_bytes((n + 1) * 4, &o->map_offsets, 0)))
        return -1;
    o->map_offsets[0] = 0;
    o->scratch_cap = sz->record_entries_max < ENTRIES_MAX ? sz->record_entries_max : ENTRIES_MAX;
    o->scratch = PyMem_RawMalloc((size_t)(2 * o->scratch_cap + 1) * sizeof(Entry));
    if (!o->scratch) {
        PyErr_NoMemory();
        return -1;
    }
    o->tmp = o->scratch + o->scratch_cap;
    return 0;
}

/* The distinct (topic, queue id) of the records, comparing each with the previous one. */
static PyObject *queue_set(const Out *o, int64_t n) {
    PyObject *set = PySet_New(NULL);
    for (int64_t i = 0; set && i < n; i++) {
        int32_t a = o->topic.offsets[i], b = o->topic.offsets[i + 1];
        if (i > 0) {
            int32_t pa = o->topic.offsets[i - 1];
            if (o->queue_id[i] == o->queue_id[i - 1] && b - a == a - pa &&
                memcmp(o->topic.data + pa, o->topic.data + a, (size_t)(b - a)) == 0)
                continue;
        }
        PyObject *key = Py_BuildValue("(s#i)", (const char *)o->topic.data + a, (Py_ssize_t)(b - a),
                                      (int)o->queue_id[i]);
        if (!key || PySet_Add(set, key) < 0) Py_CLEAR(set);
        Py_XDECREF(key);
    }
    return set;
}

static int shrink(PyObject **b, int64_t size) {
    return PyBytes_GET_SIZE(*b) == size ? 0 : _PyBytes_Resize(b, (Py_ssize_t)size);
}

/* (validity or None, null count, offsets, data) of a string/binary column. */
static PyObject *var_tuple(PyObject **bufs, int vi, int oi, int di, const VarCol *c) {
    PyObject *validity = vi >= 0 && c->nulls ? bufs[vi] : Py_None;
    return Py_BuildValue("(OnOO)", validity, (Py_ssize_t)c->nulls, bufs[oi], bufs[di]);
}

static PyObject *result(PyObject **bufs, Out *o, int64_t n) {
    if (shrink(&bufs[B_KEY_D], o->key.data_len) < 0 || shrink(&bufs[B_TAGS_D], o->tags.data_len) < 0 ||
        shrink(&bufs[B_ID_D], o->id.data_len) < 0 || shrink(&bufs[B_NAMES_D], o->names.data_len) < 0 ||
        shrink(&bufs[B_VALUES_D], o->values.data_len) < 0 ||
        shrink(&bufs[B_NAMES_O], (o->entries + 1) * 4) < 0 ||
        shrink(&bufs[B_VALUES_O], (o->entries + 1) * 4) < 0)
        return NULL;
    /* the shrunk buffers moved: only the topics and queue ids (not shrunk) are read below */
    PyObject *queues = queue_set(o, n);
    if (!queues) return NULL;
    PyObject *key = var_tuple(bufs, B_KEY_V, B_KEY_O, B_KEY_D, &o->key);
    PyObject *tags = var_tuple(bufs, B_TAGS_V, B_TAGS_O, B_TAGS_D, &o->tags);
    PyObject *body = var_tuple(bufs, -1, B_BODY_O, B_BODY_D, &o->body);
    PyObject *topic = var_tuple(bufs, -1, B_TOPIC_O, B_TOPIC_D, &o->topic);
    PyObject *id = var_tuple(bufs, B_ID_V, B_ID_O, B_ID_D, &o->id);
    PyObject *props = Py_BuildValue("(OOOOO)", bufs[B_MAP_O], bufs[B_NAMES_O], bufs[B_NAMES_D],
                                    bufs[B_VALUES_O], bufs[B_VALUES_D]);
    PyObject *out = NULL;
    if (key && tags && body && topic && id && props)
        out = Py_BuildValue("(nOOOOOOOOOOOO)", (Py_ssize_t)n, key, tags, body, topic, bufs[B_QID],
                            bufs[B_QOFF], id, bufs[B_BORN], bufs[B_STORE], props, queues,
                            o->keys_unicode ? Py_True : Py_False);
    Py_XDECREF(key);
    Py_XDECREF(tags);
    Py_XDECREF(body);
    Py_XDECREF(topic);
    Py_XDECREF(id);
    Py_XDECREF(props);
    Py_DECREF(queues);
    return out;
}

static PyObject *decode_reply(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = view.buf;
    int64_t n = (int64_t)view.len;
    PyObject *bufs[B_COUNT] = {0};
    PyObject *out = NULL;
    Out o = {0};
    Sizes sz;
    int rc;
    if (n > REPLY_MAX_BYTES) goto not_taken;
    Py_BEGIN_ALLOW_THREADS
    rc = check_reply(p, n, &sz);
    Py_END_ALLOW_THREADS
    if (rc < 0) goto not_taken;
    if (alloc_out(bufs, &o, &sz) < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    rc = fill_columns(p, n, sz.count, &o);
    Py_END_ALLOW_THREADS
    if (rc < 0) goto not_taken;
    out = result(bufs, &o, sz.count);
    goto done;
not_taken:
    out = Py_NewRef(Py_None);
done:
    PyMem_RawFree(o.scratch);
    for (int i = 0; i < B_COUNT; i++) Py_XDECREF(bufs[i]);
    PyBuffer_Release(&view);
    return out;
}

PyDoc_STRVAR(decode_reply_doc,
"decode_reply(data, /)\n--\n\n"
"A PULL_MESSAGE reply body (any buffer of MessageExt records back to back; it must not change\n"
"during the call) -> the Arrow buffers of txmq.spark._arrow.ARROW_SCHEMA's columns, or None when\n"
"a record is malformed, has a compressed body or a timestamp beyond 64-bit microseconds, or the\n"
"buffer is 2 GiB or more (the per-message decoder then raises or decodes it).\n\n"
"Returns (n, key, tags, body, topic, queue_id, queue_offset, message_id, born_us, store_us,\n"
"properties, queues, keys_unicode): string and binary columns as (validity bitmap or None, null\n"
"count, int32 offsets, data); queue_id int32 and queue_offset / born_us / store_us int64 values\n"
"(native byte order); properties as (map offsets, name offsets, name data, value offsets, value\n"
"data); queues the set of distinct (topic, queue id); keys_unicode True when some KEYS value is\n"
"not ASCII (its key column row then holds the whole value, for Python's str.split).");

static PyMethodDef methods[] = {
    {"decode_reply", decode_reply, METH_O, decode_reply_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "txmq.spark._ccolumns",
    "Pull reply bodies -> Arrow column buffers for the txmq Spark source (C; see _columns.c).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ccolumns(void) { return PyModule_Create(&module); }
