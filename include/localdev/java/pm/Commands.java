// Shared by the programs under localdev/java/ (compiled beside each by localdev.java_programs).
package pm;

import java.util.Arrays;

/** A program's commands, separated by ";" arguments, run one after the other in one JVM (a start costs seconds). */
public final class Commands {
    public interface Command {
        void run(String[] args) throws Exception;
    }

    private Commands() {
    }

    public static void each(String[] all, Command command) throws Exception {
        int from = 0;
        for (int i = 0; i <= all.length; i++) {
            if (i == all.length || all[i].equals(";")) {
                command.run(Arrays.copyOfRange(all, from, i));
                from = i + 1;
            }
        }
    }
}
