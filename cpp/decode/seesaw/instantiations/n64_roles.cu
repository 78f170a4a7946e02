// The role-split N = 64 kernel: experimental, built only under SNAPMLA_SEESAW_ROLES (roles.cuh
// says what it changes).
#include "decode/seesaw/config.h"
#if SNAPMLA_SEESAW_ROLES
#include "decode/seesaw/roles.cuh"
#endif
