// Oracle for samplers.grammar.json_schema: llama.cpp's own JSON schema -> GBNF converter.
//
// Reads one JSON schema from stdin and prints json_schema_to_grammar(schema) to stdout.
// With --dotall the schema goes through build_grammar() with options.dotall = true
// (json_schema_to_grammar() itself always converts with dotall off); its errors are
// reported with the same "JSON schema conversion failed:" prefix.
//
// Exit codes: 0 grammar printed (converter warnings, if any, on stderr), 1 the
// converter threw (its message on stderr), 2 stdin is not valid JSON.
#include "json-schema-to-grammar.h"
#include "json-schema.h"
#include "json.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <string>

static std::string convert_dotall(const common_json & schema) {
    try {
        common_chat_schema_document doc = common_chat_schema_from_json(schema);
        common_grammar_options options;
        options.dotall = true;
        return build_grammar([&](const common_grammar_builder & builder) { builder.add_schema("root", *doc.root); },
                             options);
    } catch (const std::runtime_error & e) {
        throw std::invalid_argument(std::string("JSON schema conversion failed:\n") + e.what());
    }
}

int main(int argc, char ** argv) {
    bool dotall = false;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--dotall") == 0) {
            dotall = true;
        } else {
            std::fprintf(stderr, "usage: %s [--dotall] < schema.json\n", argv[0]);
            return 2;
        }
    }
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    common_json schema;
    try {
        schema = common_json::parse(text);
    } catch (const std::exception & e) {
        std::fprintf(stderr, "invalid JSON: %s\n", e.what());
        return 2;
    }
    std::string grammar;
    try {
        grammar = dotall ? convert_dotall(schema) : json_schema_to_grammar(schema, /* force_gbnf= */ true);
    } catch (const std::exception & e) {
        std::fputs(e.what(), stderr);
        return 1;
    }
    std::fwrite(grammar.data(), 1, grammar.size(), stdout);
    return 0;
}
