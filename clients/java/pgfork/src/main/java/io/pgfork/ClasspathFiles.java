package io.pgfork;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.net.JarURLConnection;
import java.net.URISyntaxException;
import java.net.URL;
import java.nio.file.Path;
import java.util.Enumeration;
import java.util.Map;
import java.util.SortedMap;
import java.util.TreeMap;
import java.util.jar.JarEntry;
import java.util.jar.JarFile;

/**
 * The files of a migration location, relative path → content, for {@link TemplateHash#ofFiles}: a directory on
 * disk, or a classpath location (in a directory or a jar), spelled as Flyway spells them
 * ({@code classpath:db/migration}, {@code filesystem:src/main/resources/db/migration}; no prefix = classpath).
 */
final class ClasspathFiles {
    private ClasspathFiles() {
    }

    static SortedMap<String, byte[]> of(String location, ClassLoader loader) {
        if (location.startsWith("filesystem:")) {
            return TemplateHash.read(Path.of(location.substring("filesystem:".length())));
        }
        String path = location.startsWith("classpath:") ? location.substring("classpath:".length()) : location;
        path = path.replaceAll("^/+", "").replaceAll("/+$", "");
        SortedMap<String, byte[]> files = new TreeMap<>(TemplateHash.BYTES);
        try {
            Enumeration<URL> urls = loader.getResources(path);
            while (urls.hasMoreElements()) {
                URL u = urls.nextElement();
                Map<String, byte[]> found = switch (u.getProtocol()) {
                    case "file" -> TemplateHash.read(Path.of(u.toURI()));
                    case "jar" -> fromJar(u, path);
                    default -> throw new IOException("migrations at " + u + ": cannot list a " + u.getProtocol()
                            + " location; give them as a directory (filesystem:PATH)");
                };
                found.forEach(files::putIfAbsent); // the first on the classpath wins, as class loading does
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (URISyntaxException e) {
            throw new IllegalArgumentException(e);
        }
        if (files.isEmpty()) {
            throw new UncheckedIOException(new IOException("no migrations found at " + location
                    + " on the classpath: check the location (Flyway's default is classpath:db/migration)"));
        }
        return files;
    }

    private static Map<String, byte[]> fromJar(URL u, String path) throws IOException {
        SortedMap<String, byte[]> files = new TreeMap<>(TemplateHash.BYTES);
        JarURLConnection c = (JarURLConnection) u.openConnection();
        c.setUseCaches(false);
        try (JarFile jar = c.getJarFile()) {
            String prefix = path + "/";
            for (Enumeration<JarEntry> e = jar.entries(); e.hasMoreElements(); ) {
                JarEntry entry = e.nextElement();
                String name = entry.getName();
                if (entry.isDirectory() || !name.startsWith(prefix)) {
                    continue;
                }
                String rel = name.substring(prefix.length());
                if (("/" + rel).contains("/.")) {
                    continue; // names starting with "." are left out, as on disk
                }
                try (InputStream in = jar.getInputStream(entry)) {
                    files.put(rel, in.readAllBytes());
                }
            }
        }
        return files;
    }
}
