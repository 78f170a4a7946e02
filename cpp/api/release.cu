// snapmla_release_thread_resources: the calling thread's decode graphs (repeated_launch.h).
// The tensor maps the sm90 launch keeps per thread are values (addresses and sizes encoded on
// the host, no driver object), so there is nothing of theirs to release.
#include "api/checks.h"
#include "common/repeated_launch.h"

extern "C" SNAPMLA_API snapmla_status_t snapmla_release_thread_resources(void) {
  if (snapmla::api::validate_only())
    return snapmla::api::validated("snapmla_release_thread_resources");
  snapmla::release_thread_graphs();
  return SNAPMLA_SUCCESS;
}
