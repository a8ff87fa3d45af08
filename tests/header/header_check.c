/* Compiled as C99 and as C++17 with -Wall -Wextra -pedantic -Werror by ctest. */
#include "kvtier.h"

int main(void) {
  kvt_manager_config cfg;
  kvt_event ev;
  kvt_manager *m = 0;
  kvt_manager_config_init(&cfg); /* the header's inline wrapper over the exported sized init */
  kvt_manager_config_init_sized(&cfg, sizeof cfg);
  if (kvt_manager_create(&m, &cfg) != KVT_OK) return 1;
  (void)kvt_manager_poll(m, &ev, 1);
  kvt_manager_destroy(m);
  return kvt_status_str(KVT_ERR_INTERNAL)[0] == 'K' ? 0 : 1;
}
