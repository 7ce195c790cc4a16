/*
 * trainyard.staging._native: the per-file work of staging a local folder of small files.
 *
 * Python orchestrates staging; this module does only what costs a few microseconds per file
 * in Python and a fraction of that here, without holding the GIL and on several threads:
 *
 *   scan(root, extensions, threads)  list "<class>/<stem>.<ext>" files, stat them, sort by key
 *   pack(...)                        build pieces of WebDataset tar shards: headers, file
 *                                    bytes read straight into place, one pwrite per piece
 *
 * Both produce exactly what the pure-Python path in files.py produces (tests compare the
 * bytes); anything outside the simple layout (labels file, nested folders, symlinks, long
 * or unusual names) is refused by scan with a reason, and the caller uses the Python path.
 * Linux only (openat, fstatat, sync_file_range).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BLOCK 512
#define NAME_MAX_TAR 100
#define MAX_THREADS 64

/* A file's change stamp (ns): the later of its modification and status-change times. A
   rewrite that keeps the size and sets the modification time back (cp -p, rsync -t,
   touch -r) still moves the status-change time, which no user can set. */
static int64_t change_stamp(const struct stat *st) {
    int64_t m = (int64_t)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
    int64_t c = (int64_t)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec;
    return m > c ? m : c;
}

/* ------------------------------------------------------------------------------------ */
/* scan                                                                                 */

typedef struct {
    char *name;      /* file name in its folder, NUL-terminated */
    int32_t dir;     /* index into the sorted class folders */
    int32_t stem;    /* length of the name before the extension's dot */
    int64_t size;
    int64_t mtime;   /* ns */
    int err;         /* errno of fstatat, or -1 when not a regular file */
} entry_t;

typedef struct {
    char **items;
    size_t n, cap;
} strvec_t;

static int strvec_push(strvec_t *v, const char *s) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        char **items = realloc(v->items, cap * sizeof(char *));
        if (!items) return -1;
        v->items = items;
        v->cap = cap;
    }
    if (!(v->items[v->n] = strdup(s))) return -1;
    v->n++;
    return 0;
}

static void strvec_free(strvec_t *v) {
    for (size_t i = 0; i < v->n; i++) free(v->items[i]);
    free(v->items);
}

static int safe_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

static int alnum_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* folder names whose "<name>/" sort as the keys "<name>/<stem>" do */
static int cmp_folder(const void *a, const void *b) {
    const unsigned char *x = *(const unsigned char *const *)a;
    const unsigned char *y = *(const unsigned char *const *)b;
    for (;; x++, y++) {
        unsigned cx = *x ? *x : '/', cy = *y ? *y : '/';
        if (cx != cy) return (int)cx - (int)cy;
        if (!*x || !*y) {
            if (!*x && !*y) return 0;
            /* one ended (compared as '/'), the other continues: the shorter is
               "<name>/" against "<name>/<more>" only if the other's char was '/', which a
               safe name never holds */
            return !*x ? -1 : 1;
        }
    }
}

static int ends_with_ci(const char *name, size_t len, const char *ext, size_t elen) {
    if (elen > len) return 0;
    return strncasecmp(name + len - elen, ext, elen) == 0;
}

static int matches(const char *name, char **exts, size_t n_ext) {
    size_t len = strlen(name);
    for (size_t k = 0; k < n_ext; k++)
        if (ends_with_ci(name, len, exts[k], strlen(exts[k]))) return 1;
    return 0;
}

typedef struct {
    entry_t *e;
    size_t lo, hi;
    int root_fd;
    char **folders;
} stat_job_t;

/* Entries are stat'ed in listing order, folder by folder: each thread keeps one folder
   open at a time (a source may hold more class folders than the process may open files). */
static void *stat_part(void *arg) {
    stat_job_t *job = arg;
    struct stat st;
    int32_t cur = -1;
    int dir_fd = -1, dir_err = 0;
    for (size_t i = job->lo; i < job->hi; i++) {
        entry_t *e = &job->e[i];
        if (e->dir != cur) {
            if (dir_fd >= 0) close(dir_fd);
            cur = e->dir;
            dir_fd = openat(job->root_fd, job->folders[cur], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            dir_err = dir_fd < 0 ? errno : 0;
        }
        if (dir_fd < 0) {
            e->err = dir_err;
            continue;
        }
        if (fstatat(dir_fd, e->name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            e->err = errno;
            continue;
        }
        if (!S_ISREG(st.st_mode)) {
            e->err = -1;
            continue;
        }
        e->size = (int64_t)st.st_size;
        e->mtime = change_stamp(&st);
    }
    if (dir_fd >= 0) close(dir_fd);
    return NULL;
}

static int cmp_entry(const void *a, const void *b) {
    const entry_t *x = a, *y = b;
    if (x->dir != y->dir) return x->dir < y->dir ? -1 : 1;
    int32_t n = x->stem < y->stem ? x->stem : y->stem;
    int c = memcmp(x->name, y->name, (size_t)n);
    if (c) return c;
    return (x->stem > y->stem) - (x->stem < y->stem);
}

static int64_t stamp_of(int dirfd, const char *name) {
    struct stat st;
    if (fstatat(dirfd, name, &st, 0) != 0) return -1;
    return (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
}

/* Classify one directory entry: 'd' folder, 'f' regular file, 'l' symlink, 'o' other. */
static char kind_of(int dirfd, struct dirent *d) {
    switch (d->d_type) {
    case DT_DIR: return 'd';
    case DT_REG: return 'f';
    case DT_LNK: return 'l';
    case DT_UNKNOWN: {
        struct stat st;
        if (fstatat(dirfd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 'o';
        if (S_ISDIR(st.st_mode)) return 'd';
        if (S_ISREG(st.st_mode)) return 'f';
        if (S_ISLNK(st.st_mode)) return 'l';
        return 'o';
    }
    default: return 'o';
    }
}

typedef struct {
    char *reason;          /* static message: why the simple layout does not apply */
    int err;               /* errno for an OS failure, else 0 */
    strvec_t folders;      /* class folders, sorted */
    int64_t *stamps;       /* folder mtimes before listing; [0] is the root */
    entry_t *entries;
    size_t n, cap;
} scan_t;

static void scan_free(scan_t *s) {
    strvec_free(&s->folders);
    free(s->stamps);
    for (size_t i = 0; i < s->n; i++) free(s->entries[i].name);
    free(s->entries);
}

static int scan_push(scan_t *s, const char *name, int32_t dir, int32_t stem) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024;
        entry_t *e = realloc(s->entries, cap * sizeof(entry_t));
        if (!e) return -1;
        s->entries = e;
        s->cap = cap;
    }
    entry_t *e = &s->entries[s->n];
    memset(e, 0, sizeof(*e));
    if (!(e->name = strdup(name))) return -1;
    e->dir = dir;
    e->stem = stem;
    s->n++;
    return 0;
}

/* The whole scan, without the GIL. Returns 0, or -1 with s->reason (and s->err) set. */
static int scan_run(scan_t *s, const char *root, char **exts, size_t n_ext, int threads) {
    int root_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root_fd < 0) {
        s->err = errno;
        s->reason = "cannot open the source folder";
        return -1;
    }
    int64_t root_stamp = stamp_of(AT_FDCWD, root);
    DIR *d = fdopendir(dup(root_fd));
    if (!d) {
        s->err = errno;
        s->reason = "cannot list the source folder";
        close(root_fd);
        return -1;
    }
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char k = kind_of(root_fd, de);
        if (k == 'd') {
            for (const char *c = de->d_name; *c; c++)
                if (!safe_char(*c)) { s->reason = "a folder name needs a sample key rewrite"; rc = -1; }
            if (rc == 0 && strvec_push(&s->folders, de->d_name) != 0) { s->reason = "out of memory"; rc = -1; }
        } else if (k == 'l') {
            s->reason = "the source holds symbolic links"; rc = -1;
        } else if (strcmp(de->d_name, "labels.csv") == 0) {
            s->reason = "labels come from labels.csv"; rc = -1;
        } else if (matches(de->d_name, exts, n_ext)) {
            s->reason = "sample files at the top level"; rc = -1;
        }
        if (rc) break;
    }
    closedir(d);
    if (rc) { close(root_fd); return -1; }
    qsort(s->folders.items, s->folders.n, sizeof(char *), cmp_folder);
    size_t nf = s->folders.n;
    s->stamps = calloc(nf + 1, sizeof(int64_t));
    if (!s->stamps) { s->reason = "out of memory"; close(root_fd); return -1; }
    s->stamps[0] = root_stamp;
    for (size_t k = 0; k < nf && rc == 0; k++) {
        const char *folder = s->folders.items[k];
        size_t flen = strlen(folder);
        s->stamps[k + 1] = stamp_of(root_fd, folder);
        int fd = openat(root_fd, folder, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) { s->err = errno; s->reason = "cannot open a class folder"; rc = -1; break; }
        DIR *sub = fdopendir(fd);
        if (!sub) { s->err = errno; s->reason = "cannot list a class folder"; close(fd); rc = -1; break; }
        while ((de = readdir(sub))) {
            const char *name = de->d_name;
            if (name[0] == '.') continue;
            char kind = kind_of(fd, de);
            if (kind == 'd') { s->reason = "nested folders"; rc = -1; break; }
            if (kind == 'l') { s->reason = "the source holds symbolic links"; rc = -1; break; }
            if (!matches(name, exts, n_ext)) continue;
            if (kind != 'f') { s->reason = "a sample is not a regular file"; rc = -1; break; }
            /* "<stem>.<ext>": stem of [A-Za-z0-9_-], one dot, ext of [A-Za-z0-9] */
            const char *dot = strchr(name, '.');
            size_t len = strlen(name);
            /* the packer lower-cases the extension in a 16-byte buffer */
            int ok = dot && dot > name && dot[1] && !strchr(dot + 1, '.') && strlen(dot) < 16;
            for (const char *c = name; ok && c < dot; c++) ok = safe_char(*c);
            for (const char *c = dot ? dot + 1 : name; ok && *c; c++) ok = alnum_char(*c);
            /* member names "<folder>/<stem>.<ext>" and "<folder>/<stem>.cls" fit ustar */
            if (ok) ok = flen + 1 + len <= NAME_MAX_TAR && flen + 1 + (size_t)(dot - name) + 4 <= NAME_MAX_TAR;
            if (!ok) { s->reason = "a file name needs a sample key rewrite or a long header"; rc = -1; break; }
            if (scan_push(s, name, (int32_t)k, (int32_t)(dot - name)) != 0) {
                s->reason = "out of memory"; rc = -1; break;
            }
        }
        closedir(sub);
    }
    if (rc) { close(root_fd); return -1; }
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if ((size_t)threads > s->n / 4096 + 1) threads = (int)(s->n / 4096 + 1);
    pthread_t tid[MAX_THREADS];
    stat_job_t jobs[MAX_THREADS];
    int started = 0;
    for (int t = 0; t < threads; t++) {
        jobs[t] = (stat_job_t){s->entries, s->n * t / threads, s->n * (t + 1) / threads, root_fd,
                               s->folders.items};
        if (t == threads - 1 || pthread_create(&tid[t], NULL, stat_part, &jobs[t]) != 0) {
            stat_part(&jobs[t]);
        } else {
            started++;
        }
    }
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    close(root_fd);
    for (size_t i = 0; i < s->n; i++) {
        if (s->entries[i].err == -1) { s->reason = "a sample is not a regular file"; return -1; }
        if (s->entries[i].err) { s->reason = "a sample cannot be read"; s->err = s->entries[i].err; return -1; }
        if (s->entries[i].size >= 077777777777LL) { s->reason = "a sample needs a long header"; return -1; }
    }
    qsort(s->entries, s->n, sizeof(entry_t), cmp_entry);
    for (size_t i = 1; i < s->n; i++)
        if (cmp_entry(&s->entries[i - 1], &s->entries[i]) == 0) {
            s->reason = "two files map to the same sample key";
            return -1;
        }
    return 0;
}

static int parse_exts(PyObject *seq, char ***out, size_t *n) {
    PyObject *fast = PySequence_Fast(seq, "extensions must be a sequence of str");
    if (!fast) return -1;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(fast);
    char **exts = calloc((size_t)(m ? m : 1), sizeof(char *));
    if (!exts) { Py_DECREF(fast); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t k = 0; k < m; k++) {
        const char *s = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, k));
        if (!s || !(exts[k] = strdup(s))) {
            for (Py_ssize_t j = 0; j < k; j++) free(exts[j]);
            free(exts);
            Py_DECREF(fast);
            if (!PyErr_Occurred()) PyErr_NoMemory();
            return -1;
        }
    }
    Py_DECREF(fast);
    *out = exts;
    *n = (size_t)m;
    return 0;
}

PyDoc_STRVAR(scan_doc,
"scan(root, extensions, threads) -> str | tuple\n\n"
"List a folder of class folders of sample files and stat every file.\n\n"
"Returns a str (why the simple layout does not apply: use the Python path) or\n"
"(folders, stamps, file_dir, names, name_off, stem_len, sizes, mtimes, keys, key_off):\n"
"class folders sorted as keys sort; folder mtimes (ns) taken before each was listed, the\n"
"root's first; then per file, in key order: folder index (int32), file name (NUL-\n"
"terminated in names at name_off, int64), stem length (int32), size and mtime (int64),\n"
"and the key '<folder>/<stem>' (in keys at key_off, int32 offsets, Arrow's layout).");

static PyObject *py_scan(PyObject *self, PyObject *args) {
    PyObject *root_obj, *ext_obj;
    int threads;
    if (!PyArg_ParseTuple(args, "O&Oi", PyUnicode_FSConverter, &root_obj, &ext_obj, &threads))
        return NULL;
    char **exts;
    size_t n_ext;
    if (parse_exts(ext_obj, &exts, &n_ext) != 0) { Py_DECREF(root_obj); return NULL; }
    scan_t s;
    memset(&s, 0, sizeof(s));
    int rc;
    const char *root = PyBytes_AS_STRING(root_obj);
    Py_BEGIN_ALLOW_THREADS
    rc = scan_run(&s, root, exts, n_ext, threads);
    Py_END_ALLOW_THREADS
    Py_DECREF(root_obj);
    for (size_t k = 0; k < n_ext; k++) free(exts[k]);
    free(exts);
    PyObject *result = NULL;
    if (rc != 0) {
        if (s.err) result = PyUnicode_FromFormat("%s (%s)", s.reason, strerror(s.err));
        else result = PyUnicode_FromString(s.reason);
        scan_free(&s);
        return result;
    }
    size_t n = s.n, nf = s.folders.n, names_len = 0, keys_len = 0;
    for (size_t i = 0; i < n; i++) {
        names_len += strlen(s.entries[i].name) + 1;
        keys_len += strlen(s.folders.items[s.entries[i].dir]) + 1 + (size_t)s.entries[i].stem;
    }
    if (keys_len > INT32_MAX) { scan_free(&s); return PyUnicode_FromString("too many keys for one index"); }
    PyObject *folders = PyList_New((Py_ssize_t)nf);
    PyObject *stamps = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((nf + 1) * 8));
    PyObject *file_dir = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 4));
    PyObject *names = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)names_len);
    PyObject *name_off = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((n + 1) * 8));
    PyObject *stem_len = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 4));
    PyObject *sizes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 8));
    PyObject *mtimes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 8));
    PyObject *keys = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)keys_len);
    PyObject *key_off = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((n + 1) * 4));
    if (folders && stamps && file_dir && names && name_off && stem_len && sizes && mtimes && keys &&
        key_off) {
        int ok = 1;
        for (size_t k = 0; k < nf && ok; k++) {
            PyObject *f = PyUnicode_DecodeFSDefault(s.folders.items[k]);
            if (!f) ok = 0;
            else PyList_SET_ITEM(folders, (Py_ssize_t)k, f);
        }
        if (ok) {
            memcpy(PyBytes_AS_STRING(stamps), s.stamps, (nf + 1) * 8);
            int32_t *fd_out = (int32_t *)PyBytes_AS_STRING(file_dir);
            int32_t *stem_out = (int32_t *)PyBytes_AS_STRING(stem_len);
            int64_t *size_out = (int64_t *)PyBytes_AS_STRING(sizes);
            int64_t *mtime_out = (int64_t *)PyBytes_AS_STRING(mtimes);
            int64_t *noff = (int64_t *)PyBytes_AS_STRING(name_off);
            int32_t *koff = (int32_t *)PyBytes_AS_STRING(key_off);
            char *np_ = PyBytes_AS_STRING(names), *kp = PyBytes_AS_STRING(keys);
            int64_t at = 0;
            int32_t kat = 0;
            for (size_t i = 0; i < n; i++) {
                entry_t *e = &s.entries[i];
                size_t len = strlen(e->name) + 1;
                fd_out[i] = e->dir;
                stem_out[i] = e->stem;
                size_out[i] = e->size;
                mtime_out[i] = e->mtime;
                noff[i] = at;
                memcpy(np_ + at, e->name, len);
                at += (int64_t)len;
                const char *folder = s.folders.items[e->dir];
                size_t flen = strlen(folder);
                koff[i] = kat;
                memcpy(kp + kat, folder, flen);
                kp[kat + flen] = '/';
                memcpy(kp + kat + flen + 1, e->name, (size_t)e->stem);
                kat += (int32_t)(flen + 1 + (size_t)e->stem);
            }
            noff[n] = at;
            koff[n] = kat;
            result = PyTuple_Pack(10, folders, stamps, file_dir, names, name_off, stem_len, sizes,
                                  mtimes, keys, key_off);
        }
    }
    Py_XDECREF(folders);
    Py_XDECREF(stamps);
    Py_XDECREF(file_dir);
    Py_XDECREF(names);
    Py_XDECREF(name_off);
    Py_XDECREF(stem_len);
    Py_XDECREF(sizes);
    Py_XDECREF(mtimes);
    Py_XDECREF(keys);
    Py_XDECREF(key_off);
    scan_free(&s);
    if (!result && !PyErr_Occurred()) PyErr_NoMemory();
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* pack                                                                                 */

enum { OK = 0, READ_ERROR = 1, SIZE_CHANGED = 2, MTIME_CHANGED = 3, WRITE_ERROR = 4, NOT_REGULAR = 5 };

typedef struct {
    /* inputs */
    const char *root;
    char **folders;
    int n_folders;
    const char *names;
    const int64_t *name_off;
    const int32_t *stem_len;
    const int32_t *file_dir;
    const int64_t *sizes;
    const int64_t *stamps;
    const int64_t *labels;   /* per folder */
    const char *keys;
    const int32_t *key_off;
    const int64_t *pieces;   /* (shard, first, stop, start, end) rows */
    int64_t p0, p1;
    const int64_t *fds;      /* per shard */
    int start_writeback;
    /* outputs */
    int64_t *widths, *heights;
    unsigned char *buffers;  /* one slot of buffer_len bytes per thread, owned by the caller */
    int next_slot;
    /* shared state */
    int64_t next;            /* next piece to take (atomic) */
    int64_t failed_piece;    /* earliest failed piece so far (atomic min) */
    pthread_mutex_t lock;
    int64_t fail_file, fail_got, fail_mtime;
    int fail_kind, fail_errno;
    int64_t fail_shard;
    size_t buffer_len;
    /* pieces written, for the writeback thread: a queue of piece indices */
    int64_t *written;
    int64_t n_written, n_flushed;
    int packers_left;
    pthread_cond_t more;
} pack_t;

/* Starts writeback of every written piece as soon as it is written, so the fsync before
   publishing has little left to wait for; the packers never block on the device. */
static void *writeback_part(void *arg) {
    pack_t *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (p->n_flushed == p->n_written && p->packers_left > 0)
            pthread_cond_wait(&p->more, &p->lock);
        if (p->n_flushed == p->n_written) break;
        int64_t j = p->written[p->n_flushed++];
        pthread_mutex_unlock(&p->lock);
        const int64_t *pc = &p->pieces[5 * j];
        sync_file_range((int)p->fds[pc[0]], pc[3], pc[4] - pc[3], SYNC_FILE_RANGE_WRITE);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* A ustar header for a regular file: mode 0644, uid/gid 0, mtime 0 (as files.tar_header). */
static unsigned char header_template[BLOCK];
static unsigned template_sum;

static void init_template(void) {
    unsigned char *h = header_template;
    memset(h, 0, BLOCK);
    memcpy(h + 100, "0000644\0" "0000000\0" "0000000\0", 24);
    memcpy(h + 136, "00000000000\0", 12);
    memset(h + 148, ' ', 8);
    h[156] = '0';
    memcpy(h + 257, "ustar\0" "00", 8);
    template_sum = 0;
    for (int i = 0; i < BLOCK; i++) template_sum += h[i];
}

static void ustar(unsigned char *h, const char *key, size_t klen, const char *suffix,
                  size_t slen, int64_t size) {
    memcpy(h, header_template, BLOCK);
    memcpy(h, key, klen);
    memcpy(h + klen, suffix, slen);
    unsigned sum = template_sum;
    for (size_t i = 0; i < klen; i++) sum += (unsigned char)key[i];
    for (size_t i = 0; i < slen; i++) sum += (unsigned char)suffix[i];
    /* size: 11 octal digits and a NUL */
    unsigned long long v = (unsigned long long)size;
    for (int i = 10; i >= 0; i--, v >>= 3) {
        h[124 + i] = (unsigned char)('0' + (v & 7));
        sum += h[124 + i];
    }
    h[135] = 0;
    /* checksum: 6 octal digits, NUL, space (the space is already there) */
    for (int i = 5; i >= 0; i--, sum >>= 3) h[148 + i] = (unsigned char)('0' + (sum & 7));
    h[154] = 0;
}

static void fail(pack_t *p, int64_t piece, int64_t file, int kind, int err, int64_t got,
                 int64_t mtime, int64_t shard) {
    pthread_mutex_lock(&p->lock);
    if (piece < p->failed_piece) {
        p->failed_piece = piece;
        p->fail_file = file;
        p->fail_kind = kind;
        p->fail_errno = err;
        p->fail_got = got;
        p->fail_mtime = mtime;
        p->fail_shard = shard;
    }
    pthread_mutex_unlock(&p->lock);
}

static void *pack_part(void *arg) {
    pack_t *p = arg;
    int slot = __atomic_fetch_add(&p->next_slot, 1, __ATOMIC_RELAXED);
    unsigned char *buf = p->buffers + (size_t)slot * p->buffer_len;
    /* files come in key order, folder by folder: one folder open at a time */
    int32_t cur_dir = -1;
    int dir_fd = -1;
    int root_fd = open(p->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char ext[16];
    for (;;) {
        int64_t j = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (j >= p->p1 || j > __atomic_load_n(&p->failed_piece, __ATOMIC_RELAXED)) break;
        const int64_t *pc = &p->pieces[5 * j];
        int64_t shard = pc[0], first = pc[1], stop = pc[2], start = pc[3], end = pc[4];
        int64_t off = 0;
        int failed = 0;
        for (int64_t i = first; i < stop; i++) {
            int32_t dir = p->file_dir[i];
            if (dir != cur_dir) {
                if (dir_fd >= 0) close(dir_fd);
                cur_dir = dir;
                dir_fd = root_fd < 0 ? -1 : openat(root_fd, p->folders[dir], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (dir_fd < 0) {
                    fail(p, j, i, READ_ERROR, errno, 0, 0, shard);
                    cur_dir = -1;
                    failed = 1;
                    break;
                }
            }
            const char *name = p->names + p->name_off[i];
            int64_t n = p->sizes[i];
            unsigned char *data = buf + off + BLOCK;
            /* a file swapped for a FIFO or a link after listing neither blocks nor leads
               out of the folder */
            int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
            if (fd < 0) { fail(p, j, i, READ_ERROR, errno, 0, 0, shard); failed = 1; break; }
            /* one byte more than listed is asked for: a file that grew is caught here */
            ssize_t got = read(fd, data, (size_t)n + 1);
            while (got > 0 && got < n) {
                ssize_t more = read(fd, data + got, (size_t)(n + 1 - got));
                if (more <= 0) { if (more < 0) got = -1; break; }
                got += more;
            }
            if (got < 0) { int e = errno; close(fd); fail(p, j, i, READ_ERROR, e, 0, 0, shard); failed = 1; break; }
            struct stat st;
            if (fstat(fd, &st) != 0) { int e = errno; close(fd); fail(p, j, i, READ_ERROR, e, 0, 0, shard); failed = 1; break; }
            close(fd);
            int64_t mtime = change_stamp(&st);
            if (!S_ISREG(st.st_mode)) { fail(p, j, i, NOT_REGULAR, 0, got, 0, shard); failed = 1; break; }
            if (got != n) { fail(p, j, i, SIZE_CHANGED, 0, got, 0, shard); failed = 1; break; }
            if (mtime != p->stamps[i]) { fail(p, j, i, MTIME_CHANGED, 0, got, mtime, shard); failed = 1; break; }
            const char *key = p->keys + p->key_off[i];
            size_t klen = (size_t)(p->key_off[i + 1] - p->key_off[i]);
            /* member name "<key>.<ext in lower case>" */
            const char *e = name + p->stem_len[i];
            size_t elen = strlen(e);
            if (elen >= sizeof(ext)) elen = sizeof(ext) - 1;
            for (size_t c = 0; c < elen; c++) ext[c] = (char)((e[c] >= 'A' && e[c] <= 'Z') ? e[c] + 32 : e[c]);
            ustar(buf + off, key, klen, ext, elen, n);
            if (n >= 24 && memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0 && memcmp(data + 12, "IHDR", 4) == 0) {
                p->widths[i] = ((int64_t)data[16] << 24) | (data[17] << 16) | (data[18] << 8) | data[19];
                p->heights[i] = ((int64_t)data[20] << 24) | (data[21] << 16) | (data[22] << 8) | data[23];
            } else {
                p->widths[i] = p->heights[i] = -1;
            }
            int64_t padded = (n + BLOCK - 1) / BLOCK * BLOCK;
            memset(data + n, 0, (size_t)(padded - n));
            off += BLOCK + padded;
            char label[24];
            int llen = snprintf(label, sizeof(label), "%lld", (long long)p->labels[dir]);
            ustar(buf + off, key, klen, ".cls", 4, llen);
            memset(buf + off + BLOCK, 0, BLOCK);
            memcpy(buf + off + BLOCK, label, (size_t)llen);
            off += 2 * BLOCK;
        }
        if (failed) break;
        int64_t len = end - start;
        memset(buf + off, 0, (size_t)(len - off));
        int fd = (int)p->fds[shard];
        int64_t written = 0;
        while (written < len) {
            ssize_t w = pwrite(fd, buf + written, (size_t)(len - written), start + written);
            if (w < 0) {
                if (errno == EINTR) continue;
                fail(p, j, first, WRITE_ERROR, errno, 0, 0, shard);
                failed = 1;
                break;
            }
            written += w;
        }
        if (failed) break;
        if (p->start_writeback) {
            pthread_mutex_lock(&p->lock);
            p->written[p->n_written++] = j;
            pthread_cond_signal(&p->more);
            pthread_mutex_unlock(&p->lock);
        }
    }
    pthread_mutex_lock(&p->lock);
    p->packers_left--;
    pthread_cond_signal(&p->more);
    pthread_mutex_unlock(&p->lock);
    if (dir_fd >= 0) close(dir_fd);
    if (root_fd >= 0) close(root_fd);
    return NULL;
}

static int get_buf(PyObject *obj, Py_buffer *view, Py_ssize_t item, Py_ssize_t min_items, int writable,
                   const char *what) {
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) return -1;
    if (view->len < item * min_items) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes, need %zd", what, view->len, item * min_items);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(pack_doc,
"pack(root, folders, labels, names, name_off, stem_len, file_dir, sizes, stamps, keys,\n"
"     key_off, pieces, p0, p1, fds, widths, heights, buffers, threads, start_writeback)\n"
"     -> tuple\n\n"
"Build and write pieces p0..p1 of tar shards, threads taking pieces in order.\n"
"buffers: writable, threads * (longest piece + 1) bytes (reused across calls: fresh\n"
"memory page-faults on first touch).\n\n"
"Per file in a piece: its ustar header, its bytes (read with open/read/fstat/close and\n"
"compared with the listed size and mtime), padding, then the '.cls' member with its\n"
"folder's label; PNG width and height land in widths/heights (-1: not a PNG). Each piece\n"
"is written with one pwrite at its offset in its shard's fd.\n\n"
"Returns (kind, file, errno, got, mtime, shard) of the earliest failed piece, kind 0 when\n"
"none failed: 1 read error, 2 size changed (got = bytes read), 3 mtime changed, 4 write\n"
"error (shard), 5 not a regular file (any more).");

static PyObject *py_pack(PyObject *self, PyObject *args) {
    PyObject *root_obj, *folders_obj, *objs[14];
    long long p0, p1;
    int threads, start_writeback;
    if (!PyArg_ParseTuple(args, "O&OOOOOOOOOOOLLOOOOip", PyUnicode_FSConverter, &root_obj,
                          &folders_obj, &objs[0], &objs[1], &objs[2], &objs[3], &objs[4],
                          &objs[5], &objs[6], &objs[7], &objs[8], &objs[9], &p0, &p1, &objs[10],
                          &objs[11], &objs[12], &objs[13], &threads, &start_writeback))
        return NULL;
    PyObject *folders_fast = PySequence_Fast(folders_obj, "folders must be a sequence");
    if (!folders_fast) { Py_DECREF(root_obj); return NULL; }
    Py_ssize_t nf = PySequence_Fast_GET_SIZE(folders_fast);
    char **folders = calloc((size_t)(nf ? nf : 1), sizeof(char *));
    Py_buffer v[14];
    int got_views = 0;
    PyObject *result = NULL;
    pack_t p;
    memset(&p, 0, sizeof(p));
    if (!folders) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t k = 0; k < nf; k++) {
        const char *s = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(folders_fast, k));
        if (!s) goto done;
        folders[k] = (char *)s;
    }
    /* labels, names, name_off, stem_len, file_dir, sizes, stamps, keys, key_off, pieces,
       fds, widths, heights, buffers */
    static const Py_ssize_t item[14] = {8, 1, 8, 4, 4, 8, 8, 1, 4, 40, 8, 8, 8, 1};
    static const char *what[14] = {"labels", "names", "name_off", "stem_len", "file_dir",
                                   "sizes", "stamps", "keys", "key_off", "pieces", "fds",
                                   "widths", "heights", "buffers"};
    for (int k = 0; k < 14; k++) {
        if (get_buf(objs[k], &v[k], item[k], 0, k >= 11, what[k]) != 0) goto done;
        got_views++;
    }
    Py_ssize_t n = v[5].len / 8, npieces = v[9].len / 40;
    if (v[0].len / 8 < nf || v[2].len / 8 < n + 1 || v[3].len / 4 < n || v[4].len / 4 < n ||
        v[6].len / 8 < n || v[8].len / 4 < n + 1 || v[11].len / 8 < n || v[12].len / 8 < n ||
        p0 < 0 || p1 > npieces || p0 > p1) {
        PyErr_SetString(PyExc_ValueError, "pack: inconsistent array lengths or piece range");
        goto done;
    }
    p.root = PyBytes_AS_STRING(root_obj);
    p.folders = folders;
    p.n_folders = (int)nf;
    p.labels = v[0].buf;
    p.names = v[1].buf;
    p.name_off = v[2].buf;
    p.stem_len = v[3].buf;
    p.file_dir = v[4].buf;
    p.sizes = v[5].buf;
    p.stamps = v[6].buf;
    p.keys = v[7].buf;
    p.key_off = v[8].buf;
    p.pieces = v[9].buf;
    p.fds = v[10].buf;
    p.widths = v[11].buf;
    p.heights = v[12].buf;
    p.p0 = p0;
    p.p1 = p1;
    p.next = p0;
    p.failed_piece = INT64_MAX;
    p.start_writeback = start_writeback;
    for (int64_t j = p0; j < p1; j++) {
        const int64_t *pc = &p.pieces[5 * j];
        if (pc[1] < 0 || pc[2] > n || pc[1] > pc[2] || pc[0] < 0 || pc[0] >= v[10].len / 8 ||
            pc[4] < pc[3]) {
            PyErr_SetString(PyExc_ValueError, "pack: a piece is out of range");
            goto done;
        }
        int64_t need = 0;
        for (int64_t i = pc[1]; i < pc[2]; i++) {
            if (p.file_dir[i] < 0 || p.file_dir[i] >= nf) {
                PyErr_SetString(PyExc_ValueError, "pack: a folder index is out of range");
                goto done;
            }
            need += BLOCK + (p.sizes[i] + BLOCK - 1) / BLOCK * BLOCK + 2 * BLOCK;
        }
        /* the buffer also takes the one extra byte read past the listed size */
        if (need > pc[4] - pc[3]) {
            PyErr_SetString(PyExc_ValueError, "pack: a piece is shorter than its members");
            goto done;
        }
        if ((size_t)(pc[4] - pc[3]) + 1 > p.buffer_len) p.buffer_len = (size_t)(pc[4] - pc[3]) + 1;
    }
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > p1 - p0) threads = (int)(p1 - p0 > 0 ? p1 - p0 : 1);
    if ((size_t)v[13].len < (size_t)threads * p.buffer_len) {
        PyErr_Format(PyExc_ValueError, "pack: buffers: %zd bytes, need %zu", v[13].len,
                     (size_t)threads * p.buffer_len);
        goto done;
    }
    p.buffers = v[13].buf;
    p.buffer_len = (size_t)v[13].len / (size_t)threads;
    p.written = malloc((size_t)(p1 - p0 + 1) * sizeof(int64_t));
    if (!p.written) { PyErr_NoMemory(); goto done; }
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.more, NULL);
    p.packers_left = threads;
    Py_BEGIN_ALLOW_THREADS
    pthread_t tid[MAX_THREADS], wb;
    int started = 0, wb_started = 0;
    if (p.start_writeback) wb_started = pthread_create(&wb, NULL, writeback_part, &p) == 0;
    for (int t = 0; t < threads - 1; t++)
        if (pthread_create(&tid[started], NULL, pack_part, &p) == 0) started++;
    /* threads that could not start are made up for by fewer, longer-running packers */
    pthread_mutex_lock(&p.lock);
    p.packers_left -= threads - 1 - started;
    pthread_cond_signal(&p.more);
    pthread_mutex_unlock(&p.lock);
    pack_part(&p);
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
    if (wb_started) pthread_join(wb, NULL);
    Py_END_ALLOW_THREADS
    pthread_cond_destroy(&p.more);
    pthread_mutex_destroy(&p.lock);
    free(p.written);
    if (p.failed_piece == INT64_MAX)
        result = Py_BuildValue("(iLiLLL)", OK, -1LL, 0, 0LL, 0LL, 0LL);
    else
        result = Py_BuildValue("(iLiLLL)", p.fail_kind, (long long)p.fail_file, p.fail_errno,
                               (long long)p.fail_got, (long long)p.fail_mtime,
                               (long long)p.fail_shard);
done:
    for (int k = 0; k < got_views; k++) PyBuffer_Release(&v[k]);
    free(folders);
    Py_DECREF(folders_fast);
    Py_DECREF(root_obj);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", py_scan, METH_VARARGS, scan_doc},
    {"pack", py_pack, METH_VARARGS, pack_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "Per-file staging work in C: scan a folder of small files, pack them into tar shards.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    init_template();
    return PyModule_Create(&module);
}
