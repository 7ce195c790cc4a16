/*
 * _loopback.so: an LD_PRELOAD library that keeps a process's listening sockets on loopback.
 *
 * TensorFlow's gRPC server binds "0.0.0.0:<port>" whatever host TF_CONFIG names, and gRPC
 * turns that into a dual-stack [::] socket: every local training worker would be an
 * unauthenticated runtime reachable from other machines. The local launcher preloads this
 * library into its worker processes (never into pods) with TRAINYARD_TF_BIND=127.0.0.1;
 * then a bind() to the wildcard address binds that address instead:
 *
 *   AF_INET  0.0.0.0                   -> 127.0.0.1
 *   AF_INET6 ::, dual-stack socket     -> ::ffff:127.0.0.1 (IPv4 loopback clients only)
 *   AF_INET6 ::, IPV6_V6ONLY socket    -> ::1 (when TRAINYARD_TF_BIND is a 127/8 address)
 *
 * and listen() on a socket that was never bound (which the kernel would bind to the
 * wildcard) binds it that way first. Any other address is left alone. Without
 * TRAINYARD_TF_BIND the library changes nothing; a value that is not an IPv4 address makes
 * wildcard binds fail with EADDRNOTAVAIL rather than listen everywhere.
 *
 * Linux (glibc or musl) only: dlsym(RTLD_NEXT) finds the real functions.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define BIND_ENV "TRAINYARD_TF_BIND"

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);
typedef int (*listen_fn)(int, int);

static void *real(const char *name) {
    void *fn = dlsym(RTLD_NEXT, name);
    if (fn == NULL)
        errno = ENOSYS;
    return fn;
}

/* 1: rewrite to *v4, 0: leave the bind alone, -1: the variable is malformed (errno set) */
static int wanted(struct in_addr *v4) {
    const char *want = getenv(BIND_ENV);
    if (want == NULL || *want == '\0')
        return 0;
    if (inet_pton(AF_INET, want, v4) != 1) {
        errno = EADDRNOTAVAIL;
        return -1;
    }
    return 1;
}

static int bind_loopback(bind_fn bind_real, int fd, const struct sockaddr *addr, socklen_t len,
                         const struct in_addr *v4) {
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in in;
        memcpy(&in, addr, sizeof in);
        if (in.sin_addr.s_addr != htonl(INADDR_ANY))
            return bind_real(fd, addr, len);
        in.sin_addr = *v4;
        return bind_real(fd, (const struct sockaddr *)&in, sizeof in);
    }
    if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6;
        memcpy(&in6, addr, sizeof in6);
        if (!IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr))
            return bind_real(fd, addr, len);
        int v6only = 0;
        socklen_t optlen = sizeof v6only;
        if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &optlen) != 0)
            return -1;
        if (v6only) {
            if ((ntohl(v4->s_addr) >> 24) != 127) {
                errno = EADDRNOTAVAIL;
                return -1;
            }
            in6.sin6_addr = in6addr_loopback;
        } else {
            memset(&in6.sin6_addr, 0, sizeof in6.sin6_addr);
            in6.sin6_addr.s6_addr[10] = 0xff;
            in6.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&in6.sin6_addr.s6_addr[12], v4, 4);
        }
        in6.sin6_scope_id = 0;
        return bind_real(fd, (const struct sockaddr *)&in6, sizeof in6);
    }
    return bind_real(fd, addr, len);
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    bind_fn bind_real = (bind_fn)real("bind");
    if (bind_real == NULL)
        return -1;
    struct in_addr v4;
    int how = addr == NULL ? 0 : wanted(&v4);
    if (how < 0)
        return -1;
    if (how == 0)
        return bind_real(fd, addr, len);
    return bind_loopback(bind_real, fd, addr, len, &v4);
}

int listen(int fd, int backlog) {
    listen_fn listen_real = (listen_fn)real("listen");
    bind_fn bind_real = (bind_fn)real("bind");
    if (listen_real == NULL || bind_real == NULL)
        return -1;
    struct in_addr v4;
    int how = wanted(&v4);
    if (how < 0)
        return -1;
    struct sockaddr_storage name;
    socklen_t len = sizeof name;
    memset(&name, 0, sizeof name);
    if (how == 1 && getsockname(fd, (struct sockaddr *)&name, &len) == 0) {
        int unbound = (name.ss_family == AF_INET && ((struct sockaddr_in *)&name)->sin_port == 0) ||
                      (name.ss_family == AF_INET6 && ((struct sockaddr_in6 *)&name)->sin6_port == 0);
        /* getsockname gives the wildcard address and port 0: bind that, as rewritten */
        if (unbound && bind_loopback(bind_real, fd, (struct sockaddr *)&name, len, &v4) != 0)
            return -1;
    }
    return listen_real(fd, backlog);
}
