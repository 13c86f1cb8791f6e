/* A byte relay in C: `cat` between two pipes (scenario 1 baseline).
 *
 * Reads what is available from stdin (64 KiB at a time) and writes it all to stdout, until EOF.
 * No framing, no parsing: the floor for any relay process. Compiled at run time by bench/run.py
 * into bench/build/ (git-ignored). */
#include <errno.h>
#include <unistd.h>

int main(void) {
    static char buf[65536];
    for (;;) {
        ssize_t n = read(0, buf, sizeof buf);
        if (n == 0) return 0;
        if (n < 0) {
            if (errno == EINTR) continue;
            return 1;
        }
        char *p = buf;
        while (n > 0) {
            ssize_t w = write(1, p, (size_t)n);
            if (w < 0) {
                if (errno == EINTR) continue;
                return 1;
            }
            p += w;
            n -= w;
        }
    }
}
