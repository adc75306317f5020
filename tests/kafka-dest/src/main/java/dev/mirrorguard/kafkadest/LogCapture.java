package dev.mirrorguard.kafkadest;

import com.fasterxml.jackson.databind.node.ArrayNode;
import java.util.ArrayList;
import java.util.List;
import org.apache.logging.log4j.Level;
import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.core.LogEvent;
import org.apache.logging.log4j.core.LoggerContext;
import org.apache.logging.log4j.core.appender.AbstractAppender;
import org.apache.logging.log4j.core.config.Configuration;
import org.apache.logging.log4j.core.config.Property;

/**
 * Keeps Kafka's WARN and ERROR lines, and the INFO lines of the storage engine that tell what it
 * did with an append (skipped batches, epoch cache changes, recovery), in memory for the
 * {@code logs} command: the tests assert on what Kafka itself said. Bounded (oldest dropped).
 */
final class LogCapture extends AbstractAppender {
    static final int MAX = 20_000;
    static final List<String[]> LINES = new ArrayList<>();
    static int dropped;

    private LogCapture() {
        super("kafka-dest-capture", null, null, true, Property.EMPTY_ARRAY);
    }

    static void install() {
        LoggerContext ctx = (LoggerContext) LogManager.getContext(false);
        Configuration cfg = ctx.getConfiguration();
        LogCapture app = new LogCapture();
        app.start();
        cfg.addAppender(app);
        cfg.getRootLogger().addAppender(app, Level.INFO, null);
        ctx.updateLoggers();
    }

    static boolean wanted(LogEvent e) {
        if (e.getLevel().isMoreSpecificThan(Level.WARN)) {
            return true;
        }
        String logger = e.getLoggerName() == null ? "" : e.getLoggerName();
        return logger.startsWith("org.apache.kafka.storage") || logger.startsWith("kafka.log");
    }

    @Override
    public void append(LogEvent e) {
        if (!wanted(e)) {
            return;
        }
        String msg = e.getMessage() == null ? "" : e.getMessage().getFormattedMessage();
        if (e.getThrown() != null) {
            msg = msg + " (" + e.getThrown() + ")";
        }
        synchronized (LINES) {
            if (LINES.size() >= MAX) {
                LINES.remove(0);
                dropped++;
            }
            LINES.add(new String[] {e.getLevel().name(), e.getLoggerName(), msg});
        }
    }

    static int size() {
        synchronized (LINES) {
            return LINES.size() + dropped;
        }
    }

    static ArrayNode since(int index) {
        ArrayNode out = KafkaDest.JSON.createArrayNode();
        synchronized (LINES) {
            for (int i = Math.max(0, index - dropped); i < LINES.size(); i++) {
                String[] l = LINES.get(i);
                out.addObject().put("level", l[0]).put("logger", l[1]).put("message", l[2]);
            }
        }
        return out;
    }
}
