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
  printf("consumer linked kvtier %s\n", kvt_version());
  return strcmp(kvt_version(), "0.4.0") != 0;
}
