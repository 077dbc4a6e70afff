// JSON Schema -> GBNF grammar whose every complete match is a JSON document valid against
// the schema (then parse_gbnf + GrammarStage constrain generation to it).
//
//   std::string gbnf = json_schema_to_gbnf(R"({"type":"object","properties":{"n":{"type":"integer"}}})");
//
// Covered: type (string, number, integer, boolean, null, object, array, and lists of them),
// properties / required (listed properties in schema order, required ones always present),
// additionalProperties (absent or false: no other members, as the reference does; true or a
// schema: further members after the listed ones), items, minItems / maxItems, minLength /
// maxLength, enum, const, anyOf / oneOf, local $ref ("#/$defs/..", "#/definitions/.."), and
// {} or true (any JSON value). Keywords that would constrain values further (pattern, format,
// minimum, allOf, ...) throw Error(Unsupported) naming the keyword: the output must never
// violate a schema silently. Annotations (title, description, default, examples) are ignored.
#pragma once
#include <string>

namespace moe {

// Throws Error(InvalidArgument) for malformed JSON or schema, Error(Unsupported) as above.
std::string json_schema_to_gbnf(const std::string &schema_json);

}  // namespace moe
