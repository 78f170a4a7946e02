/* Linked into libsnapmla.so by tools/glibc_2_28_link.sh only (the manylinux_2_28 build on a
 * newer system): the three glibc symbols newer than 2.28 that the toolchain's static runtimes
 * reference, defined in the library itself so that it runs on glibc 2.28.
 *
 * - __libc_single_threaded (glibc 2.32), read by libstdc++'s reference counts and guards: 0,
 *   "maybe several threads", so they always take the atomic path (correct, the old behaviour).
 * - arc4random (glibc 2.36), reachable only through std::random_device, which snapmla never
 *   constructs: the getrandom system call (Linux 3.17), retried on EINTR; /dev/urandom where
 *   it is refused (ENOSYS, a seccomp filter); abort where neither gives a word.
 * - _dl_find_object (glibc 2.35), which libgcc's unwinder calls to find the .eh_frame_hdr of a
 *   code address: the same answer from dl_iterate_phdr (glibc 2.2.5). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HIDDEN __attribute__((visibility("hidden")))

HIDDEN char __libc_single_threaded = 0;

HIDDEN uint32_t arc4random(void) {
  uint32_t v = 0;
  for (;;) {
    const long got = syscall(SYS_getrandom, &v, sizeof v, 0);
    if (got == (long)sizeof v) return v;
    if (got < 0 && errno != EINTR) break;
  }
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const ssize_t got = read(fd, &v, sizeof v);
    close(fd);
    if (got == (ssize_t)sizeof v) return v;
  }
  abort();
}

struct find_request {
  uintptr_t pc;
  struct dl_find_object* out;
  int found;
};

static int find_in(struct dl_phdr_info* info, size_t size, void* data) {
  struct find_request* r = (struct find_request*)data;
  uintptr_t lo = UINTPTR_MAX, hi = 0, eh_frame = 0;
  int inside = 0;
  (void)size;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)* ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD) {
      const uintptr_t a = info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
      if (a < lo) lo = a;
      if (b > hi) hi = b;
      if (r->pc >= a && r->pc < b) inside = 1;
    } else if (ph->p_type == PT_GNU_EH_FRAME) {
      eh_frame = info->dlpi_addr + ph->p_vaddr;
    }
  }
  if (!inside) return 0;
  memset(r->out, 0, sizeof *r->out);
  r->out->dlfo_map_start = (void*)lo;
  r->out->dlfo_map_end = (void*)hi;
  r->out->dlfo_eh_frame = (void*)eh_frame;
  r->found = 1;
  return 1;
}

HIDDEN int _dl_find_object(void* address, struct dl_find_object* result) {
  struct find_request r = {(uintptr_t)address, result, 0};
  dl_iterate_phdr(find_in, &r);
  return r.found ? 0 : -1;
}
