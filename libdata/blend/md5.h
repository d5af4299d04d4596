// MD5 (RFC 1321): Megatron names its index caches by the md5 of the dataset's description.
#pragma once

#include <string>
#include <string_view>

namespace dlm::data::detail {

// Lowercase hex digest, as hashlib.md5(text).hexdigest().
std::string md5_hex(std::string_view text);

}  // namespace dlm::data::detail
