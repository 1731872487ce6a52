// podium::base::edit_distance_below — the Levenshtein distance of two texts, when it is below
// a bound.
//
// The controller folds similar log lines of many ranks into one (python/podium/_src/
// log_aggregate.py, as Monarch's log client): a new line is compared with the lines that
// began the window's groups. Done in Python, a window of a few thousand distinct lines took
// tens of seconds; here it is the same dynamic program over code points, stopped as soon as
// every path costs the bound or more.
//
// Threads: a pure function, callable from any thread.
// Invariants:
//   ED-1 edit_distance_below(a, b, limit) is the Levenshtein distance (insertions, deletions,
//        substitutions of one code point each) of a and b when it is < limit, and nullopt
//        otherwise (always nullopt for limit 0). Invalid UTF-8 bytes count as one code point
//        each.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace podium::base {

[[nodiscard]] std::optional<size_t> edit_distance_below(std::string_view a, std::string_view b,
                                                        size_t limit);

}  // namespace podium::base
