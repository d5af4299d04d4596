// Whether this test binary runs under AddressSanitizer or ThreadSanitizer (CI's sanitizer stages). Their
// runtimes reserve terabytes of shadow address space and carry redzones, so RSS bounds and RLIMIT_AS limits
// say nothing there: tests that set or measure those skip under kSanitized.
#pragma once

namespace dlm::test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace dlm::test
