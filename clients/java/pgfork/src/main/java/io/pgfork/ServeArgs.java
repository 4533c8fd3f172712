package io.pgfork;

import java.util.ArrayList;
import java.util.List;

/**
 * The extra arguments for a {@code pgfork serve} the glue starts: {@code $PGFORK_SERVE_ARGS} split into words as a
 * POSIX shell splits them (single and double quotes, backslashes; no expansions), as the Python, JS, Go and Rust glue
 * read it. No secrets there: every local user reads a command line; a password or token goes in the environment,
 * which serve inherits ({@code PGFORK_PG_URL}, …).
 */
final class ServeArgs {
    private ServeArgs() {
    }

    /** $PGFORK_SERVE_ARGS split into words; a PgforkException (not showing the value) when it cannot be split. */
    static List<String> fromEnv() {
        String s = System.getenv("PGFORK_SERVE_ARGS");
        return split(s == null ? "" : s);
    }

    /** s split into words as a POSIX shell splits them (no expansions). */
    static List<String> split(String s) {
        List<String> words = new ArrayList<>();
        StringBuilder word = null;
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '\'') {
                int end = s.indexOf('\'', i + 1);
                if (end < 0) {
                    throw bad("an unclosed quote");
                }
                word = append(word, s.substring(i + 1, end));
                i = end;
            } else if (c == '"') {
                word = word == null ? new StringBuilder() : word;
                int j = i + 1;
                for (; j < s.length() && s.charAt(j) != '"'; j++) {
                    char d = s.charAt(j);
                    // Inside double quotes a backslash escapes only $ ` " \ and a newline.
                    if (d == '\\' && j + 1 < s.length() && "$`\"\\\n".indexOf(s.charAt(j + 1)) >= 0) {
                        j++;
                        if (s.charAt(j) != '\n') {
                            word.append(s.charAt(j));
                        }
                    } else {
                        word.append(d);
                    }
                }
                if (j >= s.length()) {
                    throw bad("an unclosed quote");
                }
                i = j;
            } else if (c == '\\') {
                if (i + 1 >= s.length()) {
                    throw bad("a trailing backslash");
                }
                i++;
                if (s.charAt(i) != '\n') {
                    word = append(word, String.valueOf(s.charAt(i)));
                }
            } else if (c == ' ' || c == '\t' || c == '\n') {
                if (word != null) {
                    words.add(word.toString());
                    word = null;
                }
            } else {
                word = append(word, String.valueOf(c));
            }
        }
        if (word != null) {
            words.add(word.toString());
        }
        return words;
    }

    private static StringBuilder append(StringBuilder word, String s) {
        return (word == null ? new StringBuilder() : word).append(s);
    }

    private static PgforkException bad(String why) {
        return new PgforkException("pgfork: PGFORK_SERVE_ARGS has " + why + ": quote it as for a POSIX shell", null);
    }
}
