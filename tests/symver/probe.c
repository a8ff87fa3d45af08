/* A program linked against today's libkvtier. It names one call of the newest version node
   (KVT_PROBE_CALL, never made: taking its address binds it at load) or none, and prints the
   library's version. Loaded against a library that lacks the node, it must not start. */
#include <stdio.h>

const char *kvt_version(void);
#ifdef KVT_PROBE_CALL
void KVT_PROBE_CALL(void);
void (*volatile kvt_probe_newest)(void) = KVT_PROBE_CALL;
#endif

int main(void) {
  printf("kvtier %s\n", kvt_version());
  return 0;
}
