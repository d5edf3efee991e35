/* txmq.store._ccqruns: the runs of commit log bytes a raw pull serves, from a consume queue's
 * packed entries, in one C pass (txmq.store._raw_read calls it; its pure-Python loop gives the
 * same answer and runs where this module is not built).
 *
 * Input: consume queue entries back to back, 20 bytes each (RocketMQ ConsumeQueue.CQ_STORE_UNIT_SIZE;
 * drawn with its struct format ">QIQ" in src/txmq/store/_codec.py), big-endian:
 *
 *     0 commit log offset u64 | 8 size u32 | 12 tag hash u64
 *
 * runs(entries, max_bytes, tag_hashes) walks the entries in order: an entry of size 0 (a hole)
 * is skipped, and so is one whose tag hash is not in tag_hashes (a set or frozenset of ints; None
 * keeps every entry); the walk stops before the kept entry that would take the kept bytes past
 * max_bytes, unless no entry is kept yet (at least one is returned). Kept entries whose records
 * lie back to back in the commit log form one run.
 *
 * Returns (count, looked, runs): the kept entries, the entries walked (those before the stop),
 * and a list of (start, end) commit log offsets, one per run, in order.
 * Raises ValueError for a buffer that is not whole entries, TypeError for tag_hashes of another
 * type. The GIL is held (the set lookups need it; the walk is short).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define CQ_ENTRY_BYTES 20
#define SIZE_AT 8
#define TAG_HASH_AT 12

static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t be64(const uint8_t *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* Append (start, end) to list; 0 on success, -1 with an exception set. */
static int add_run(PyObject *list, int64_t start, int64_t end) {
    PyObject *run = Py_BuildValue("(LL)", (long long)start, (long long)end);
    if (run == NULL)
        return -1;
    int rc = PyList_Append(list, run);
    Py_DECREF(run);
    return rc;
}

/* 1 if the entry's tag hash is kept, 0 if not, -1 with an exception set. */
static int kept(PyObject *tag_hashes, const uint8_t *entry) {
    if (tag_hashes == Py_None)
        return 1;
    PyObject *h = PyLong_FromUnsignedLongLong(be64(entry + TAG_HASH_AT));
    if (h == NULL)
        return -1;
    int in = PySet_Contains(tag_hashes, h);
    Py_DECREF(h);
    return in;
}

static PyObject *runs(PyObject *self, PyObject *args) {
    Py_buffer cq;
    long long max_bytes;
    PyObject *tag_hashes;
    if (!PyArg_ParseTuple(args, "y*LO", &cq, &max_bytes, &tag_hashes))
        return NULL;
    PyObject *out = NULL;
    if (cq.len % CQ_ENTRY_BYTES != 0) {
        PyErr_Format(PyExc_ValueError, "%zd bytes are not whole consume queue entries", cq.len);
        goto done;
    }
    if (tag_hashes != Py_None && !PyAnySet_Check(tag_hashes)) {
        PyErr_SetString(PyExc_TypeError, "tag_hashes must be a set, a frozenset or None");
        goto done;
    }
    out = PyList_New(0);
    if (out == NULL)
        goto done;
    const uint8_t *p = (const uint8_t *)cq.buf;
    Py_ssize_t n = cq.len / CQ_ENTRY_BYTES, k, count = 0;
    int64_t total = 0, run_start = -1, run_end = -1;
    for (k = 0; k < n; k++, p += CQ_ENTRY_BYTES) {
        int64_t clo = (int64_t)be64(p);
        int64_t size = be32(p + SIZE_AT);
        if (size == 0)
            continue;
        int keep = kept(tag_hashes, p);
        if (keep < 0)
            goto fail;
        if (!keep)
            continue;
        if (count && total + size > max_bytes)
            break;
        if (clo != run_end) {
            if (run_end > run_start && add_run(out, run_start, run_end) < 0)
                goto fail;
            run_start = clo;
        }
        run_end = clo + size;
        total += size;
        count++;
    }
    if (run_end > run_start && add_run(out, run_start, run_end) < 0)
        goto fail;
    PyBuffer_Release(&cq);
    return Py_BuildValue("(nnN)", count, k, out);
fail:
    Py_CLEAR(out);
done:
    PyBuffer_Release(&cq);
    return out;
}

static PyMethodDef methods[] = {
    {"runs", runs, METH_VARARGS,
     "runs(entries, max_bytes, tag_hashes) -> (count, looked, [(start, end), ...]): the runs of "
     "commit log bytes a raw pull serves (module comment of src/txmq/store/_cqruns.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ccqruns",
    "The runs of commit log bytes a raw pull serves, from packed consume queue entries (C).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__ccqruns(void) { return PyModule_Create(&module); }
