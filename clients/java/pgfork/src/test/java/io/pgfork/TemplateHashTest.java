package io.pgfork;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The shared vectors every client's tests read: clients/testdata/template-hash-vectors.json. */
class TemplateHashTest {
    static Path vectors() {
        return Path.of(System.getProperty("pgfork.testdata", "../../testdata"), "template-hash-vectors.json");
    }

    @Test
    void sharedVectors(@TempDir Path tmp) throws IOException {
        JsonNode doc = new ObjectMapper().readTree(vectors().toFile());
        assertEquals("pgfork-template-hash/1", doc.path("algorithm").asText());
        int n = 0;
        for (JsonNode c : doc.path("cases")) {
            Path base = Files.createDirectory(tmp.resolve("case" + n++));
            Path tree = Files.createDirectory(base.resolve("tree"));
            for (Map.Entry<String, JsonNode> f : c.path("files").properties()) {
                write(tree.resolve(f.getKey()), f.getValue().asText());
            }
            for (Map.Entry<String, JsonNode> f : c.path("outside").properties()) {
                write(base.resolve(f.getKey()), f.getValue().asText());
            }
            for (JsonNode l : c.path("symlinks")) {
                Path link = tree.resolve(l.path("path").asText());
                Files.createDirectories(link.getParent());
                Files.createSymbolicLink(link, Path.of(l.path("target").asText()));
            }
            String got = c.path("no_dir").asBoolean() ? TemplateHash.of(null, c.path("extra_key").asText())
                    : TemplateHash.of(tree, c.path("extra_key").asText());
            assertEquals(c.path("hash").asText(), got, "case " + c.path("name").asText());
        }
        assertTrue(n >= 8, "the vectors file has its cases");
    }

    @Test
    void symlinkedRootHashesLikeItsTarget(@TempDir Path tmp) throws IOException {
        Path real = Files.createDirectory(tmp.resolve("real"));
        write(real.resolve("001.sql"), "CREATE TABLE t (id int);\n");
        Path link = Files.createSymbolicLink(tmp.resolve("link"), real);
        assertEquals(TemplateHash.of(real, "k"), TemplateHash.of(link, "k"));
    }

    @Test
    void classpathLocationHashesLikeTheDirectory() throws Exception {
        // src/test/resources/db/migration is on the test classpath as a directory.
        Map<String, byte[]> files = ClasspathFiles.of("classpath:db/migration", getClass().getClassLoader());
        assertFalse(files.isEmpty());
        assertEquals(TemplateHash.of(Path.of("src/test/resources/db/migration"), ""), TemplateHash.ofFiles(files, ""));
    }

    private static void write(Path p, String content) throws IOException {
        Files.createDirectories(p.getParent());
        Files.writeString(p, content, StandardCharsets.UTF_8);
    }
}
