package io.pgfork.junit;

import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/** Every ```java block of clients/java/README.md is code the tests run: found verbatim in a test or example source. */
class ReadmeTest {
    @Test
    void readmeExamplesAreTheTestedCode() throws IOException {
        Path root = Path.of("..").toRealPath();
        String readme = Files.readString(root.resolve("README.md"));
        Matcher m = Pattern.compile("```java\\n(.*?)```", Pattern.DOTALL).matcher(readme);
        StringBuilder sources = new StringBuilder();
        try (Stream<Path> files = Files.walk(root)) {
            for (Path p : files.filter(p -> p.toString().endsWith(".java") && !p.toString().contains("/target/")).toList()) {
                sources.append(Files.readString(p)).append('\n');
            }
        }
        List<String> blocks = new ArrayList<>();
        while (m.find()) {
            blocks.add(m.group(1));
        }
        assertTrue(blocks.size() >= 5, "the README has its examples");
        for (String b : blocks) {
            assertTrue(sources.indexOf(b) >= 0, "README block not found in any source:\n" + b);
        }
    }
}
