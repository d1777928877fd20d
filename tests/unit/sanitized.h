/* SANITIZED: 1 when the test is built with AddressSanitizer or ThreadSanitizer (gcc says so with
 * __SANITIZE_*__, clang with __has_feature), else 0. Tests that depend on how the allocator or
 * the timing behaves under a sanitizer branch on it. */
#ifndef LONGHAUL_TEST_SANITIZED_H
#define LONGHAUL_TEST_SANITIZED_H

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#endif
