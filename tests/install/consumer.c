#include <stdio.h>
#include <string.h>

#include <kvtier.h>

int main(void) {
  kvt_manager_config cfg;
  kvt_manager *m = NULL;
  kvt_manager_config_init(&cfg);
  cfg.g1_memory = KVT_MEMORY_HOST;
  if (kvt_manager_create(&m, &cfg) != KVT_OK) return 1;
  kvt_manager_destroy(m);
  char header[32];
  snprintf(header, sizeof header, "%d.%d.%d", KVT_VERSION_MAJOR, KVT_VERSION_MINOR,
           KVT_VERSION_PATCH);
  printf("consumer linked kvtier %s, built with the header of %s\n", kvt_version(), header);
  return strcmp(kvt_version(), header) != 0;
}
