/* Run a command and write its resource usage as JSON (scenarios 2 and 4).
 *
 * usage: spawn_rusage OUTFILE CMD [ARG...]
 *
 * Why not os.wait4 on a child of the harness: Linux keeps a process's peak RSS across exec
 * (exec_mmap records the old mm's high-water mark), and a child forked from the harness starts
 * with the harness's mm, so its ru_maxrss can never be lower than the harness's own RSS. This
 * launcher is tiny: the command it forks starts from a ~1 MB mm, so ru_maxrss is the command's.
 * SIGTERM/SIGINT/SIGHUP are forwarded to the command; the exit status is passed through. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile pid_t child = 0;

static void forward(int sig) {
    if (child > 0) kill(child, sig);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: spawn_rusage OUTFILE CMD [ARG...]\n");
        return 125;
    }
    struct sigaction sa = {0};
    sa.sa_handler = forward;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    pid_t pid = fork();
    if (pid < 0) return 125;
    if (pid == 0) {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        execvp(argv[2], argv + 2);
        perror("spawn_rusage: exec");
        _exit(127);
    }
    child = pid;
    int status = 0;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno != EINTR) return 125;
    }
    FILE *f = fopen(argv[1], "w");
    if (f) {
        fprintf(f, "{\"utime\": %ld.%06ld, \"stime\": %ld.%06ld, \"maxrss_kb\": %ld}\n",
                (long)ru.ru_utime.tv_sec, (long)ru.ru_utime.tv_usec, (long)ru.ru_stime.tv_sec,
                (long)ru.ru_stime.tv_usec, ru.ru_maxrss);
        fclose(f);
    }
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 125;
}
