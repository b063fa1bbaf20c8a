"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 16:37:44.686600
"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


revision: str = '0001'
down_revision: Union[str, None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table('images',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('repository', sa.String(length=512), nullable=False),
    sa.Column('tag', sa.String(length=128), nullable=True),
    sa.Column('digest', sa.String(length=160), nullable=False),
    sa.Column('builder', sa.String(length=32), nullable=True),
    sa.Column('build_log_path', sa.Text(), nullable=True),
    sa.Column('build_log_tail', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('repository', 'tag', 'digest', name='uq_images_repository_tag_digest')
    )
    with op.batch_alter_table('images', schema=None) as batch_op:
        batch_op.create_index('ix_images_digest', ['digest'], unique=False)

    op.create_table('releases',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('repository', sa.String(length=512), nullable=False),
    sa.Column('tag', sa.String(length=128), nullable=False),
    sa.Column('previous_tag', sa.String(length=128), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('repository', 'tag', name='uq_releases_repository_tag')
    )
    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('release_id', sa.Integer(), nullable=False),
    sa.Column('image_id', sa.Integer(), nullable=True),
    sa.Column('candidate_digest', sa.String(length=160), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('stage', sa.String(length=32), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('driver_host', sa.String(length=255), nullable=True),
    sa.Column('driver_pid', sa.Integer(), nullable=True),
    sa.Column('triggered_by', sa.String(length=128), nullable=True),
    sa.Column('manifest_path', sa.Text(), nullable=True),
    sa.Column('manifest_sha256', sa.String(length=64), nullable=False),
    sa.Column('manifest_text', sa.Text(), nullable=False),
    sa.Column('flow_run_id', sa.String(length=64), nullable=True),
    sa.Column('stage_seconds', sa.JSON(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.CheckConstraint("status IN ('running', 'passed', 'failed', 'incomplete', 'error', 'aborted')", name='ck_runs_status'),
    sa.ForeignKeyConstraint(['image_id'], ['images.id'], ),
    sa.ForeignKeyConstraint(['release_id'], ['releases.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index('ix_runs_active_digest', ['candidate_digest', 'status'], unique=False)
        batch_op.create_index('ix_runs_image', ['image_id'], unique=False)
        batch_op.create_index('ix_runs_release_started', ['release_id', 'started_at'], unique=False)
        batch_op.create_index('uq_runs_one_running_per_digest', ['candidate_digest'], unique=True, sqlite_where=sa.text("status = 'running'"), postgresql_where=sa.text("status = 'running'"))

    op.create_table('case_results',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('case_id', sa.String(length=256), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=True),
    sa.Column('variant', sa.String(length=128), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('error_class', sa.String(length=32), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('metrics', sa.JSON(), nullable=False),
    sa.Column('samples', sa.JSON(), nullable=False),
    sa.Column('probes', sa.JSON(), nullable=False),
    sa.Column('environment', sa.JSON(), nullable=False),
    sa.Column('log_tail', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('queue_wait_s', sa.Float(), nullable=True),
    sa.Column('exec_s', sa.Float(), nullable=True),
    sa.Column('node', sa.String(length=128), nullable=True),
    sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("status IN ('passed', 'failed', 'error')", name='ck_case_results_status'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'case_id', name='uq_case_results_run_case')
    )
    with op.batch_alter_table('case_results', schema=None) as batch_op:
        batch_op.create_index('ix_case_results_case_run', ['case_id', 'run_id'], unique=False)

    op.create_table('component_checks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('rule', sa.String(length=16), nullable=False),
    sa.Column('expected', sa.String(length=256), nullable=False),
    sa.Column('actual', sa.String(length=256), nullable=True),
    sa.Column('ok', sa.Boolean(), nullable=False),
    sa.Column('optional', sa.Boolean(), nullable=False),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'name', name='uq_component_checks_run_name')
    )
    op.create_table('gate_decisions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('digest', sa.String(length=160), nullable=True),
    sa.Column('verdict', sa.String(length=16), nullable=False),
    sa.Column('reasons', sa.JSON(), nullable=False),
    sa.Column('policy_sha256', sa.String(length=64), nullable=False),
    sa.Column('baseline_run_id', sa.Integer(), nullable=True),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("verdict IN ('PASS', 'FAIL', 'INCOMPLETE')", name='ck_gate_decisions_verdict'),
    sa.ForeignKeyConstraint(['baseline_run_id'], ['runs.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('gate_decisions', schema=None) as batch_op:
        batch_op.create_index('ix_gate_decisions_digest_verdict', ['digest', 'verdict', 'decided_at'], unique=False)
        batch_op.create_index('ix_gate_decisions_run', ['run_id', 'decided_at'], unique=False)

    op.create_table('promotions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('decision_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('target_name', sa.String(length=128), nullable=False),
    sa.Column('source_ref', sa.String(length=700), nullable=False),
    sa.Column('source_digest', sa.String(length=160), nullable=False),
    sa.Column('target_ref', sa.String(length=700), nullable=False),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('forced', sa.Boolean(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.Column('promoted_by', sa.String(length=128), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("outcome IN ('promoted', 'skipped', 'failed', 'refused', 'dry-run')", name='ck_promotions_outcome'),
    sa.ForeignKeyConstraint(['decision_id'], ['gate_decisions.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('promotions', schema=None) as batch_op:
        batch_op.create_index('ix_promotions_run', ['run_id'], unique=False)
        batch_op.create_index('ix_promotions_target', ['target_ref'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('promotions', schema=None) as batch_op:
        batch_op.drop_index('ix_promotions_target')
        batch_op.drop_index('ix_promotions_run')

    op.drop_table('promotions')
    with op.batch_alter_table('gate_decisions', schema=None) as batch_op:
        batch_op.drop_index('ix_gate_decisions_run')
        batch_op.drop_index('ix_gate_decisions_digest_verdict')

    op.drop_table('gate_decisions')
    op.drop_table('component_checks')
    with op.batch_alter_table('case_results', schema=None) as batch_op:
        batch_op.drop_index('ix_case_results_case_run')

    op.drop_table('case_results')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index('uq_runs_one_running_per_digest', sqlite_where=sa.text("status = 'running'"), postgresql_where=sa.text("status = 'running'"))
        batch_op.drop_index('ix_runs_release_started')
        batch_op.drop_index('ix_runs_image')
        batch_op.drop_index('ix_runs_active_digest')

    op.drop_table('runs')
    op.drop_table('releases')
    with op.batch_alter_table('images', schema=None) as batch_op:
        batch_op.drop_index('ix_images_digest')

    op.drop_table('images')
