package io.pgfork.spring;

/** Which optional libraries the test's classpath has: pgfork-spring's one home for the check. */
final class Classpath {
    private Classpath() {}

    /**
     * @param name a class's binary name
     * @return whether the class can be loaded (without initializing it) by pgfork-spring's class loader
     */
    static boolean has(String name) {
        try {
            Class.forName(name, false, Classpath.class.getClassLoader());
            return true;
        } catch (ClassNotFoundException | LinkageError e) {
            return false;
        }
    }
}
