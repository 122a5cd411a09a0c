// A name a setting takes and the value it stands for: programs hold the value, and only the
// edge (config keys, flags, logs, messages) the name. Tables of them stand beside their enums
// (actors/run/trainer.h, kernels/optimizer.h).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace troupe::kernels {

template <typename E>
struct Named {
  const char* name;
  E value;
};

// The name of `value` in `table` (every value of the enum has one).
template <typename E, std::size_t N>
const char* nameIn(const Named<E> (&table)[N], E value) {
  for (const auto& row : table)
    if (row.value == value) return row.name;
  return table[0].name;
}

// The value `name` stands for in `table`; nullptr where it names none (the caller's error names
// the known ones: namesOf(table)).
template <typename E, std::size_t N>
const E* valueNamed(const Named<E> (&table)[N], std::string_view name) {
  for (const auto& row : table)
    if (name == row.name) return &row.value;
  return nullptr;
}

// The names of a table's rows (each with a `name`: the schedules', the optimizers'), comma
// separated, in the table's order: for help texts and "unknown ... (known: ...)" errors.
template <typename Rows>
std::string namesOf(const Rows& rows) {
  std::string names;
  for (const auto& row : rows)
    names += (names.empty() ? "" : ", ") + std::string(row.name);
  return names;
}

}  // namespace troupe::kernels
