# cython: language_level=3, boundscheck=False, wraparound=False
"""The compiled twin of `zonebus.store.records.encode_run_py` (Cython, built when a compiler and zlib's header are
there: `setup.py`).

Same contract, same bytes: each record's header is written byte by byte (little-endian) straight into the
buffer, grown once for the whole run, the subject (its UTF-8, which a str keeps) and the data are copied in with
`memcpy`, and the CRC is zlib's `crc32` over the record as written. `records` uses it unless `ZONEBUS_PURE_PYTHON`
is set (the tests run both: `tests/stream/test_store_runs.py`).
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport uint64_t
from libc.string cimport memcpy


cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object text, Py_ssize_t *size) except NULL

cdef extern from "zlib.h":
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int size) nogil

cdef enum:
    HDR_LEN = 31  # (records.HDR_LEN)
    MSG = 1  # (records.MSG)


cdef inline void _put(unsigned char *p, uint64_t value, int size) noexcept nogil:
    cdef int k
    for k in range(size):
        p[k] = <unsigned char>(value >> (8 * k))


def encode_run(bytearray buf, list subjects, list datas, Py_ssize_t start, unsigned long long seq, long long ts,
               long long seg, long long off, long long limit, long long overhead):
    """See `zonebus.store.records.encode_run_py`."""
    cdef Py_ssize_t n = len(subjects), i = start, slen, dlen, total, grow = 0, at
    cdef long long pos = off
    cdef const char *subj
    cdef unsigned char *p
    cdef unsigned long crc
    cdef bytes data
    if len(datas) != n:
        raise ValueError("subjects and datas differ in length")
    while i < n and pos < limit:  # first the bytes of the records that fit: one resize
        PyUnicode_AsUTF8AndSize(subjects[i], &slen)
        data = datas[i]
        total = HDR_LEN + slen + PyBytes_GET_SIZE(data) + 4
        grow += total
        pos += total
        i += 1
    end = i
    at = PyByteArray_GET_SIZE(buf)
    PyByteArray_Resize(buf, at + grow)
    sizes = []
    locs = []
    i = start
    while i < end:
        subject = subjects[i]
        subj = PyUnicode_AsUTF8AndSize(subject, &slen)
        data = datas[i]
        dlen = PyBytes_GET_SIZE(data)
        total = HDR_LEN + slen + dlen + 4
        p = <unsigned char *>PyByteArray_AS_STRING(buf) + at
        _put(p, total, 4)
        p[4] = MSG
        _put(p + 5, seq, 8)
        _put(p + 13, <uint64_t>ts, 8)
        _put(p + 21, slen, 2)
        _put(p + 23, 0, 4)
        _put(p + 27, dlen, 4)
        memcpy(p + HDR_LEN, subj, slen)
        memcpy(p + HDR_LEN + slen, PyBytes_AS_STRING(data), dlen)
        crc = crc32(0, p, <unsigned int>(total - 4))
        _put(p + total - 4, crc, 4)
        sizes.append(slen + dlen + overhead)
        locs.append(seg | off)
        off += total
        at += total
        seq += 1
        i += 1
    return end, off, sizes, locs
