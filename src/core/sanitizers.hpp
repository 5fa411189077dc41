// Whether this translation unit is built under a sanitizer: GCC says so with __SANITIZE_ADDRESS__
// and __SANITIZE_THREAD__, clang with __has_feature.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define GPUPOOL_UNDER_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GPUPOOL_UNDER_ADDRESS_SANITIZER 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define GPUPOOL_UNDER_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GPUPOOL_UNDER_THREAD_SANITIZER 1
#endif
#endif
