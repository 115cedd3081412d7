/* An engine outside the tree, in C, against an installed libexpertclient.so (built by
 * tests/client/install_test.sh once with pkg-config and once with find_package): acquires one
 * expert from a real expertd and checks the slot's bytes against the pack file.
 *
 * usage: consumer SOCKET PACK LAYER EXPERT OFFSET BYTES  (OFFSET, BYTES: the expert's block) */
#define _POSIX_C_SOURCE 200809L /* pread */
#include <expertd/client/expert_client_c.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: %s SOCKET PACK LAYER EXPERT OFFSET BYTES\n", argv[0]);
    return 2;
  }
  const uint32_t layer = (uint32_t)atoi(argv[3]), expert = (uint32_t)atoi(argv[4]);
  const long long offset = atoll(argv[5]);
  const size_t bytes = (size_t)atoll(argv[6]);
  char err[512] = {0};
  expertd_client* c = expertd_connect(argv[1], err, sizeof err);
  if (!c) {
    fprintf(stderr, "connect: %s\n", err);
    return 1;
  }
  if (layer >= expertd_n_moe_layers(c) || expert >= expertd_n_experts(c) ||
      bytes > expertd_slot_bytes(c)) {
    fprintf(stderr, "the pack is not the one expected\n");
    return 1;
  }
  const void* slot = NULL;
  uint8_t ready = 0;
  if (expertd_acquire(c, layer, &expert, 1, &slot, &ready) != 0 ||
      expertd_wait_ready(c, -1) != 0) {
    fprintf(stderr, "acquire: %s\n", expertd_last_error(c));
    return 1;
  }
  unsigned char* want = malloc(bytes);
  const int fd = open(argv[2], O_RDONLY);
  if (fd < 0 || pread(fd, want, bytes, offset) != (ssize_t)bytes) {
    fprintf(stderr, "cannot read %s\n", argv[2]);
    return 1;
  }
  const int same = memcmp(slot, want, bytes) == 0;
  expertd_release(c);
  /* A bad expert id is an error naming the cause, not a crash. */
  const uint32_t bad = expertd_n_experts(c);
  const int refused = expertd_acquire(c, layer, &bad, 1, &slot, &ready) == -1 &&
                      strlen(expertd_last_error(c)) > 0;
  printf("layer %u expert %u: %zu bytes %s the pack's; expert %u refused: %s\n", layer, expert,
         bytes, same ? "equal to" : "DIFFERENT from", bad, refused ? expertd_last_error(c) : "NO");
  expertd_close(c);
  close(fd);
  free(want);
  return same && refused ? 0 : 1;
}
