package io.pgfork;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileVisitResult;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.SimpleFileVisitor;
import java.nio.file.attribute.BasicFileAttributes;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.SortedMap;
import java.util.TreeMap;

/**
 * The template hash every pgfork client computes the same way ({@code pgfork-template-hash/1}, tested against
 * clients/testdata/template-hash-vectors.json): SHA-256 over every file below a directory (relative path with
 * forward slashes, length and content; names starting with "." left out; symlinks to files followed, to directories
 * not entered, dangling ones left out), in the order of the paths' UTF-8 bytes, then an extra key. 32 hex digits.
 */
public final class TemplateHash {
    private TemplateHash() {
    }

    /**
     * The hash of a directory's files and an extra key.
     *
     * @param dir the directory (may be a symlink to one), or null for none
     * @param extraKey text hashed after the files (change it when code that shapes the template changes)
     * @return 32 lowercase hex digits
     */
    public static String of(Path dir, String extraKey) {
        return ofFiles(dir == null ? new TreeMap<>(BYTES) : read(dir), extraKey);
    }

    /**
     * The hash over files given as relative path → content (a classpath location's files, for example).
     *
     * @param files relative paths with forward slashes and their contents
     * @param extraKey text hashed after the files
     * @return 32 lowercase hex digits
     */
    public static String ofFiles(Map<String, byte[]> files, String extraKey) {
        SortedMap<String, byte[]> sorted = new TreeMap<>(BYTES);
        sorted.putAll(files);
        MessageDigest h;
        try {
            h = MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is missing from this JVM", e);
        }
        h.update("pgfork-template-hash/1\n".getBytes(StandardCharsets.UTF_8));
        for (Map.Entry<String, byte[]> f : sorted.entrySet()) {
            h.update(("file " + f.getKey() + "\n" + f.getValue().length + "\n").getBytes(StandardCharsets.UTF_8));
            h.update(f.getValue());
            h.update((byte) '\n');
        }
        byte[] extra = (extraKey == null ? "" : extraKey).getBytes(StandardCharsets.UTF_8);
        h.update(("extra " + extra.length + "\n").getBytes(StandardCharsets.UTF_8));
        h.update(extra);
        return HexFormat.of().formatHex(h.digest()).substring(0, 32);
    }

    /** Orders strings by their UTF-8 bytes, as Go's sort.Strings does. */
    static final java.util.Comparator<String> BYTES = (a, b) ->
            Arrays.compareUnsigned(a.getBytes(StandardCharsets.UTF_8), b.getBytes(StandardCharsets.UTF_8));

    /**
     * The files below dir that the hash covers, relative path → content.
     *
     * @param dir the directory
     * @return the files, sorted by the paths' UTF-8 bytes
     */
    static SortedMap<String, byte[]> read(Path dir) {
        SortedMap<String, byte[]> files = new TreeMap<>(BYTES);
        if (!Files.isDirectory(dir)) {
            throw new UncheckedIOException(new IOException("template hash: " + dir + " is not a directory"));
        }
        Path root;
        try {
            root = dir.toRealPath();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        List<Path> found = new ArrayList<>();
        try {
            Files.walkFileTree(root, new SimpleFileVisitor<>() {
                @Override
                public FileVisitResult preVisitDirectory(Path d, BasicFileAttributes attrs) {
                    if (!d.equals(root) && d.getFileName().toString().startsWith(".")) {
                        return FileVisitResult.SKIP_SUBTREE;
                    }
                    return FileVisitResult.CONTINUE;
                }

                @Override
                public FileVisitResult visitFile(Path f, BasicFileAttributes attrs) {
                    // A symlink counts when it leads to a regular file; to a directory or nowhere, not.
                    if (!f.getFileName().toString().startsWith(".") && Files.isRegularFile(f)) {
                        found.add(f);
                    }
                    return FileVisitResult.CONTINUE;
                }
            });
            for (Path f : found) {
                files.put(root.relativize(f).toString().replace(java.io.File.separatorChar, '/'), Files.readAllBytes(f));
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return files;
    }
}
