/*
 * The fake nvidia-cuda-mps-control's native client (issue 35): one command line
 * sent to the fake daemon over its FIFO slots, its framed reply printed.
 *
 * It speaks what the POSIX sh client (fakes/bin/nvidia-cuda-mps-control) speaks
 * on its fast path, with the same checks, slot claim, proof that the slots are
 * the live daemon's, request and reply framing, and exit statuses (the protocol:
 * the docstring of dra_driver/fakes/mps_fifo.py). It exists because a command's
 * start is on every MPS prepare's path and a native process starts for less CPU
 * than dash reading a script and reading the reply a byte at a time.
 *
 * Whatever it does not serve itself it hands, before anything is sent, to the sh
 * client with the same arguments and environment (execv), which hands what it
 * does not serve to the Python client: the interactive shell (no arguments), the
 * daemon's own flags, -v, an argument with a newline, a value of the environment
 * the Python fake would refuse, no live daemon behind the slots, every slot
 * taken, and any failure before the request is written. So the answers are
 * always the daemon's, and the chain is native -> sh -> Python.
 *
 * Where it does better than the sh client, and why:
 * - the slots directory is opened once and everything in it is reached through
 *   that descriptor (openat), so the directory proved to be the daemon's is the
 *   one used, even if it is renamed meanwhile;
 * - the reply FIFO is opened non-blocking (then made blocking): a daemon killed
 *   between the proof and that open gives end of file (the no-daemon message)
 *   instead of an open that waits for a writer forever;
 * - a slot it claimed but could not open is given back (its lock removed) before
 *   the sh client takes over: the daemon's thread for it never saw the client.
 * Build: hack/build-fake-mps-client.sh (C99 and POSIX only).
 */
#define _XOPEN_SOURCE 700 /* POSIX.1-2008 with realpath */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define SLOTS_DIR "fifo-control" /* mps_fifo.SLOTS_DIR */
#define DAEMON_FILE "daemon"     /* mps_fifo.DAEMON_FILE */
#define SLOT_COUNT 32            /* mps_fifo.SLOT_COUNT */
#define MAGIC "fake-mps-fifo 1"  /* mps_fifo.MAGIC */
#define DEFAULT_PIPE_DIRECTORY "/tmp/nvidia-mps"
/* From this binary's directory (fakes/native/build/) to the sh client. */
#define LAUNCHER_FROM_BINARY "/../../bin/nvidia-cuda-mps-control"
#define NO_DAEMON \
  "Cannot find MPS control daemon process: the daemon closed the connection\n"

static char **saved_argv;

/* The sh client, with our arguments and environment; returns only if it cannot
 * be run (said on stderr, exit 1: nothing may fail silently). */
static void run_shell_client(void) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  char launcher[PATH_MAX + sizeof LAUNCHER_FROM_BINARY];
  char resolved[PATH_MAX];
  if (n > 0) {
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL) *slash = '\0';
    snprintf(launcher, sizeof launcher, "%s%s", self, LAUNCHER_FROM_BINARY);
    /* Resolved, so that the script finds the package from its real place. */
    if (realpath(launcher, resolved) != NULL) {
      execv(resolved, saved_argv);
    } else {
      strcpy(resolved, launcher);
    }
  } else {
    strcpy(resolved, "/proc/self/exe" LAUNCHER_FROM_BINARY);
  }
  fprintf(stderr,
          "nvidia-cuda-mps-control (fake, native client): cannot run the sh "
          "client %s: %s\n",
          resolved, strerror(errno));
  exit(1);
}

/* Only digits: what the Python fake reads as a number (int()) without failing;
 * the sh client's `*[!0-9]*` (the empty value passes). */
static int all_digits(const char *s) {
  for (; *s; s++)
    if (*s < '0' || *s > '9') return 0;
  return 1;
}

/* The sh client's check of FAKE_MPS_COMMAND_DELAY_S: digits and dots, at most
 * one dot, not a lone dot (`*[!0-9.]* | *.*.* | .`). */
static int plausible_delay(const char *s) {
  int dots = 0;
  for (const char *p = s; *p; p++) {
    if (*p == '.')
      dots++;
    else if (*p < '0' || *p > '9')
      return 0;
  }
  return dots <= 1 && strcmp(s, ".") != 0;
}

/* An argument the Python client serves: the daemon's flags, -v, a newline. */
static int for_python(const char *a) {
  static const char *const flags[] = {
      "-d", "--daemon", "-f", "--foreground", "-m", "--multiuser",
      "-multiuser-server", "-S", "--static-partitioning", "-p", "--protocol",
      "-v", "--version"};
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
    if (strcmp(a, flags[i]) == 0) return 1;
  return strchr(a, '\n') != NULL;
}

static const char *env_or(const char *name, const char *fallback) {
  const char *v = getenv(name);
  return v != NULL ? v : fallback;
}

/* All of data to fd; 0 when it could not (nothing more is tried). */
static int write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t w = write(fd, data, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      return 0;
    }
    data += w;
    len -= (size_t)w;
  }
  return 1;
}

/* The slots directory, proved to be the one the live daemon holds open: its
 * DAEMON_FILE names the daemon's pid and a descriptor it holds on the directory,
 * and /proc/<pid>/fd/<n> must be this very directory (same device and inode),
 * not a copy and not a reused pid. -1 when not. */
static int open_live_slots(void) {
  const char *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
  if (pipe == NULL || *pipe == '\0') pipe = DEFAULT_PIPE_DIRECTORY;
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/%s", pipe, SLOTS_DIR) >= (int)sizeof path)
    return -1;
  int dir = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return -1;
  int fd = openat(dir, DAEMON_FILE, O_RDONLY | O_CLOEXEC);
  char text[64];
  ssize_t n = fd < 0 ? -1 : read(fd, text, sizeof text - 1);
  if (fd >= 0) close(fd);
  unsigned long pid = 0, held = 0;
  char *end = NULL;
  if (n > 0) {
    text[n] = '\0';
    pid = strtoul(text, &end, 10);
    if (end != text && *end == ' ') {
      char *start = end + 1;
      held = strtoul(start, &end, 10);
      if (end == start || *end != '\n') end = NULL;
    } else {
      end = NULL;
    }
  }
  struct stat mine, theirs;
  char proc[64];
  if (end != NULL && fstat(dir, &mine) == 0 &&
      snprintf(proc, sizeof proc, "/proc/%lu/fd/%lu", pid, held) < (int)sizeof proc &&
      stat(proc, &theirs) == 0 && mine.st_dev == theirs.st_dev &&
      mine.st_ino == theirs.st_ino)
    return dir;
  close(dir);
  return -1;
}

/* Claims a slot: its lock created with O_EXCL, our pid in it (the kernel makes us
 * its owner: the daemon takes our UID from there). From a slot of our own, so
 * concurrent commands seldom collide; SLOT_COUNT tries. -1 when all are taken. */
static int claim_slot(int dir, long pid) {
  char lock[32], line[32];
  int len = snprintf(line, sizeof line, "%ld\n", pid);
  int n = (int)(pid % SLOT_COUNT);
  for (int tries = 0; tries < SLOT_COUNT; tries++, n = (n + 1) % SLOT_COUNT) {
    snprintf(lock, sizeof lock, "%d.lock", n);
    int fd = openat(dir, lock, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) continue;
    write_all(fd, line, (size_t)len); /* for people; the daemon reads the owner */
    close(fd);
    return n;
  }
  return -1;
}

/* The request (mps_fifo's framing): MAGIC, our pid, CUDA_MPS_LOG_DIRECTORY,
 * FAKE_MPS_COMMAND_DELAY_S, "argv <count>", then each argument, a line each. */
static char *frame_request(int argc, char **argv, long pid, size_t *len) {
  const char *logs = env_or("CUDA_MPS_LOG_DIRECTORY", "");
  const char *delay = env_or("FAKE_MPS_COMMAND_DELAY_S", "");
  size_t size = sizeof MAGIC + strlen(logs) + strlen(delay) + 64;
  for (int i = 1; i < argc; i++) size += strlen(argv[i]) + 1;
  char *buf = malloc(size);
  if (buf == NULL) return NULL;
  size_t at = (size_t)snprintf(buf, size, "%s\n%ld\n%s\n%s\nargv %d\n", MAGIC,
                               pid, logs, delay, argc - 1);
  for (int i = 1; i < argc; i++) {
    size_t n = strlen(argv[i]);
    memcpy(buf + at, argv[i], n);
    buf[at + n] = '\n';
    at += n + 1;
  }
  *len = at;
  return buf;
}

/* What the reply says goes to one stream at a time, written when the stream
 * changes or the reply ends (stdout and stderr keep their order). */
struct output {
  int fd;
  char *data;
  size_t len, cap;
};

static void flush_output(struct output *out) {
  if (out->len > 0) write_all(out->fd, out->data, out->len);
  out->len = 0;
}

static void emit(struct output *out, int fd, const char *text, size_t n, int newline) {
  if (fd != out->fd) {
    flush_output(out);
    out->fd = fd;
  }
  size_t need = out->len + n + 1;
  if (need > out->cap) {
    size_t cap = out->cap * 2 > need ? out->cap * 2 : need;
    char *grown = realloc(out->data, cap);
    if (grown == NULL) { /* unlikely; write what we have, then this line directly */
      flush_output(out);
      write_all(fd, text, n);
      if (newline) write_all(fd, "\n", 1);
      return;
    }
    out->data = grown;
    out->cap = cap;
  }
  memcpy(out->data + out->len, text, n);
  out->len += n;
  if (newline) out->data[out->len++] = '\n';
}

/* Reads the reply up to its end tag and prints it; the exit status: 0 for the
 * tag k, 1 for any other; at end of file first (the daemon died), the no-daemon
 * message and 1. A last line without its newline is not a line (as sh's read). */
static int print_reply(int res) {
  static char block[65536];
  char *pending = NULL; /* a line that spans reads */
  size_t pending_len = 0;
  struct output out = {1, NULL, 0, 0};
  for (;;) {
    ssize_t got = read(res, block, sizeof block);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    char *data = block;
    size_t len = (size_t)got;
    if (pending_len > 0) { /* join the line begun in an earlier read */
      char *joined = realloc(pending, pending_len + len);
      if (joined == NULL) break;
      memcpy(joined + pending_len, block, len);
      pending = joined;
      data = joined;
      len += pending_len;
      pending_len = 0;
    }
    size_t start = 0;
    for (;;) {
      char *nl = memchr(data + start, '\n', len - start);
      if (nl == NULL) break;
      size_t line_len = (size_t)(nl - (data + start));
      const char *line = data + start;
      start += line_len + 1;
      char kind = line_len > 0 ? line[0] : '\0';
      if (kind == 'o' || kind == 'O' || kind == 'e' || kind == 'E') {
        int fd = (kind == 'o' || kind == 'O') ? 1 : 2;
        emit(&out, fd, line + 1, line_len - 1, kind == 'o' || kind == 'e');
        continue;
      }
      flush_output(&out);
      return line_len == 1 && kind == 'k' ? 0 : 1; /* the end tag */
    }
    if (start < len) { /* keep the unfinished line for the next read */
      size_t rest = len - start;
      char *kept = malloc(rest);
      if (kept == NULL) break;
      memcpy(kept, data + start, rest);
      free(pending);
      pending = kept;
      pending_len = rest;
    }
  }
  flush_output(&out);
  write_all(2, NO_DAEMON, sizeof NO_DAEMON - 1);
  return 1;
}

int main(int argc, char **argv) {
  saved_argv = argv;
  if (argc < 2) run_shell_client(); /* the interactive shell: sh serves it */
  for (int i = 1; i < argc; i++)
    if (for_python(argv[i])) run_shell_client();
  if (!all_digits(env_or("CUDA_MPS_PROTOCOL_VERSION", "")) ||
      !plausible_delay(env_or("FAKE_MPS_COMMAND_DELAY_S", "")))
    run_shell_client();

  int dir = open_live_slots();
  if (dir < 0) run_shell_client();
  long pid = (long)getpid();
  int slot = claim_slot(dir, pid);
  if (slot < 0) run_shell_client();
  char name[32];
  /* The reply FIFO first (see the head of the file: non-blocking, no hang), then
   * the request FIFO read-write (never blocks on Linux). */
  snprintf(name, sizeof name, "%d.res", slot);
  int res = openat(dir, name, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  int req = -1;
  if (res >= 0 && fcntl(res, F_SETFL, 0) == 0) {
    snprintf(name, sizeof name, "%d.req", slot);
    req = openat(dir, name, O_RDWR | O_CLOEXEC);
  }
  size_t len = 0;
  char *request = req >= 0 ? frame_request(argc, argv, pid, &len) : NULL;
  ssize_t sent = request != NULL ? write(req, request, len) : -1;
  if (sent <= 0) {
    /* Nothing sent: the daemon's thread for this slot has not seen us (or only
     * our open, and it reads end of file when execv closes it), so the slot is
     * given back before the sh client takes over. */
    snprintf(name, sizeof name, "%d.lock", slot);
    if (req < 0) unlinkat(dir, name, 0);
    run_shell_client();
  }
  /* Once part of it went, the daemon answers (a cut request with a refusal). */
  write_all(req, request + sent, len - (size_t)sent);
  return print_reply(res);
}
