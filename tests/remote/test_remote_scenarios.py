"""The embedded broker's SPI scenarios, re-run through the mq:// client.

The test functions are the ones of tests/test_embedded_broker.py and
tests/test_embedded_xa.py, imported unchanged; this folder's conftest makes their
``factory`` (hence ``conn`` and ``session``) a remote client of a jms service in front of
the same broker. Scenarios left out make their own in-process brokers (restarts,
limits read back after reopening, naming of a directory) and so say nothing about the
wire; the service-specific guarantees are in tests/test_jmsservice_*.py.
"""

from test_embedded_broker import (  # noqa: F401  (collected here with this folder's fixtures)
    test_auto_acknowledge_consumes_at_receive,
    test_browse_does_not_consume_and_honours_selector,
    test_byte_limits,
    test_changing_a_durable_subscription_selector_recreates_it,
    test_changing_a_message_after_send_does_not_change_what_was_sent,
    test_client_acknowledge_acks_everything_delivered_so_far,
    test_client_ids_are_unique_and_set_first,
    test_closing_a_connection_returns_unacked_messages_redelivered,
    test_commit_on_non_transacted_session_is_illegal,
    test_competing_consumers_share_a_queue_round_robin,
    test_durable_subscription_rules,
    test_every_body_kind_travels,
    test_expired_messages_are_never_delivered_and_go_to_the_dmq,
    test_individual_acknowledge_acks_only_that_message,
    test_many_producers_and_consumers_lose_and_duplicate_nothing,
    test_max_num_msgs_reject_newest,
    test_max_num_msgs_remove_oldest_goes_to_dmq,
    test_message_listener_receives_and_failure_redelivers,
    test_priority_order_then_fifo,
    test_priority_out_of_range_is_refused,
    test_receive_on_closed_consumer_returns_or_raises,
    test_received_message_is_read_only_until_cleared,
    test_recover_redelivers_in_order_with_delivery_count,
    test_remove_oldest_without_dmq_drops,
    test_reply_to_round_trip,
    test_rollback_discards_sends_and_redelivers_receives,
    test_selector_consumer_skips_a_backlog_and_sees_later_arrivals_before_it,
    test_selector_on_header_fields,
    test_selector_on_queue_consumer_leaves_others,
    test_send_sets_headers_and_receive_gets_them,
    test_stopped_connection_does_not_deliver_until_started,
    test_temporary_queue_belongs_to_its_connection_and_dies_with_it,
    test_temporary_topic,
    test_topic_delivers_to_every_subscriber_present,
    test_topic_subscriber_selector_and_no_local,
    test_transacted_sends_are_invisible_until_commit,
    test_transacted_session_context_manager,
    test_unserialisable_object_message_is_refused_at_send,
)
from test_embedded_xa import (  # noqa: F401
    test_closing_a_session_fails_its_active_branch,
    test_closing_the_connection_rolls_back_unprepared_keeps_prepared,
    test_different_brokers_are_different_rms,
    test_empty_branch_votes_read_only_and_is_forgotten,
    test_join_from_a_second_session_of_the_same_rm,
    test_one_phase_commit,
    test_outside_a_branch_an_xa_session_auto_acknowledges,
    test_protocol_errors_have_xa_codes,
    test_rollback_of_prepared_branch_returns_source_and_drops_target,
    test_tmfail_marks_rollback_only,
    test_two_phase_commit_moves_the_message,
    test_xa_session_refuses_local_commit,
    xconn,
)
